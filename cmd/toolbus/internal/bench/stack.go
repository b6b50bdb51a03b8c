package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/seal"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// The bench's toolbus: an executor, a planner and an injector in one process on an
// embedded server, with an instant scripted model that records when each step reached it.

// stepClock records when each step of each run reached the model.
type stepClock struct {
	mu    sync.Mutex
	times map[string][]time.Time
}

func (c *stepClock) mark(run string, step int) {
	now := time.Now()
	c.mu.Lock()
	ts := c.times[run]
	for len(ts) <= step {
		ts = append(ts, time.Time{})
	}
	if ts[step].IsZero() {
		ts[step] = now
	}
	c.times[run] = ts
	c.mu.Unlock()
}

func (c *stepClock) latencies(run string) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts := c.times[run]
	var out []time.Duration
	for i := 1; i < len(ts); i++ {
		out = append(out, ts[i].Sub(ts[i-1]))
	}
	return out
}

// benchStack is toolbus in one process on an embedded server: an executor, a planner
// and an injector with an instant scripted model that records when each step reached it.
type benchStack struct {
	bus   *events.Bus
	trbl  *trouble
	clock *stepClock
	ended chan string
	close func()
}

// setup is how the bench's toolbus is set up: memory storage, the read mirror, fair share,
// signed events.
type setup struct{ memory, readMirror, fair, sign bool }

// newBenchStack starts the stack; runs whose id starts with "long" last longSteps steps,
// the others steps.
func newBenchStack(ctx context.Context, srv *embedded.Server, set setup, k, steps, longSteps, runs int, trbl *trouble) (*benchStack, error) {
	nc, err := srv.Connect()
	if err != nil {
		return nil, err
	}
	var cleanup []func()
	st := &benchStack{trbl: trbl, clock: &stepClock{times: map[string][]time.Time{}}, ended: make(chan string, runs),
		close: func() {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}}
	cleanup = append(cleanup, nc.Close)
	fail := func(err error) (*benchStack, error) { st.close(); return nil, err }
	var mirror []provision.Option
	if set.readMirror {
		mirror = append(mirror, provision.WithReadMirror())
	}
	if st.bus, _, err = provision.Setup(ctx, nc, events.Config{Memory: set.memory, Stream: "TOOLBUS", FairShare: set.fair}, mirror...); err != nil {
		return fail(err)
	}
	if set.sign {
		kf, err := seal.NewKeyFile(seal.SignerName(seal.KindRole, "bench"))
		if err != nil {
			return fail(err)
		}
		st.bus.SetSigner(seal.SignerOf(kf))
	}
	log := slog.New(st.trbl)
	short, long := NoopScript(k, steps), NoopScript(k, longSteps)
	model := planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		st.clock.mark(req.RunID, req.Step)
		if strings.HasPrefix(req.RunID, "long") {
			return long.Complete(ctx, req)
		}
		return short.Complete(ctx, req)
	})
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "diag"); err != nil {
		return fail(err)
	}
	exec, err := executor.New(reg, executor.WithLogger(log), executor.WithInstance("bench"))
	if err != nil {
		return fail(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	cleanup = append(cleanup, func() { stop(); wg.Wait() })
	const conc = 256
	runW := func(f func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); _ = f(wctx) }()
	}
	wc := workerconfig.WorkerConfig{Instance: "bench", Concurrency: conc, Logger: log, Grace: time.Second}
	w, err := worker.New(st.bus, exec, worker.Config{WorkerConfig: wc, Observer: st.trbl})
	if err != nil {
		return fail(err)
	}
	runW(w.Run)
	var cat *store.Catalog
	for i := 0; i < 200; i++ {
		if cat, err = st.bus.Store().WatchCatalog(wctx, log); err != nil {
			return fail(err)
		}
		if _, ok := cat.Lookup("noop"); ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	maxSteps := max(steps, longSteps) + 1
	p, err := planner.New(st.bus, model, cat, planner.Config{WorkerConfig: wc, Observer: st.trbl})
	if err != nil {
		return fail(err)
	}
	in, err := injector.New(st.bus, injector.Config{WorkerConfig: wc, Observer: st.trbl, Defaults: toolbus.DefaultLimits{MaxSteps: maxSteps}})
	if err != nil {
		return fail(err)
	}
	runW(p.Run)
	runW(withCheckpoints(set.sign, st.bus, log, in.Run))
	if set.fair {
		fs, err := newFair(ctx, st.bus, log)
		if err != nil {
			return fail(err)
		}
		runW(fs.Run)
	}
	sub, err := nc.Subscribe("toolbus.*.run.*", func(m *nats.Msg) {
		if strings.Contains(m.Subject, ".run.started.") || strings.Contains(m.Subject, ".run.cancel.") {
			return
		}
		run, _ := events.RunIDFromSubject(m.Subject)
		st.ended <- run
	})
	if err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, func() { _ = sub.Unsubscribe() })
	return st, nil
}

func (st *benchStack) start(ctx context.Context, run string, steps int) error {
	return st.bus.StartRun(ctx, "/toolbus/bench/1", toolbus.RunStarted{RunID: run,
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "bench"}}, Limits: toolbus.Limits{MaxSteps: steps + 1}})
}

func (st *benchStack) wait(n int) error {
	timeout := time.After(5 * time.Minute)
	stalled := time.NewTicker(3 * time.Second)
	defer stalled.Stop()
	for i := 0; i < n; {
		select {
		case <-st.ended:
			i++
			stalled.Reset(3 * time.Second)
		case <-stalled.C:
			st.trbl.stalls.Add(1)
			if st.trbl.debug {
				st.trbl.note("stalled 3 s: " + st.consumers())
			}
		case <-timeout:
			return errors.New("runs did not finish in 5 minutes")
		}
	}
	return nil
}

// consumers describes the stream's consumers that have work: what a stall waits on.
func (st *benchStack) consumers() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var out []string
	for _, name := range []string{st.bus.Config().Stream, events.QueueStreamName(st.bus.Config().Stream)} {
		s, err := st.bus.JetStream().Stream(ctx, name)
		if err != nil {
			continue
		}
		for ci := range s.ListConsumers(ctx).Info() {
			if ci.NumPending+uint64(ci.NumAckPending)+uint64(ci.NumRedelivered) == 0 {
				continue
			}
			out = append(out, fmt.Sprintf("%s{pending %d, ack pending %d, redelivered %d, waiting %d}",
				ci.Name, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting))
		}
	}
	return strings.Join(out, " ")
}

// NoopScript asks for k noop calls at each of the first steps-1 steps, then answers.
func NoopScript(k, steps int) planner.Model {
	return planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		if req.Step >= steps-1 {
			return planner.Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "done"}}, nil
		}
		calls := make([]toolbus.ToolCall, k)
		for i := range calls {
			calls[i] = toolbus.ToolCall{CallID: "c" + strconv.Itoa(i), Tool: "noop", Arguments: `{}`}
		}
		return planner.Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}}, nil
	})
}

// withCheckpoints runs the injector's run and, where it signs, its checkpoints beside it
// (as internal/node does): a signed row measures both.
func withCheckpoints(sign bool, bus *events.Bus, log *slog.Logger, run func(context.Context) error) func(context.Context) error {
	if !sign {
		return run
	}
	return func(ctx context.Context) error {
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- (&checkpoint.Service{Bus: bus, Log: log}).Run(cctx) }()
		err := run(ctx)
		stop()
		<-done
		return err
	}
}
