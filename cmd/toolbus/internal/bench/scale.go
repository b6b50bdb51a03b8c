package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// ScaleRow is one line of the scale table: many tools served by many deployments, the
// calls of every run spread over all the tools.
type ScaleRow struct {
	Storage     string `json:"storage"`
	Tools       int    `json:"tools"`
	Deployments int    `json:"deployments"`
	K           int    `json:"calls_per_step"`
	Steps       int    `json:"steps_per_run"`
	Runs        int    `json:"runs_in_flight"`
	// InitMS is how long the setup of the stream, the buckets and the tools' queues (one
	// durable consumer each, what `toolbus init` does) took on an empty server.
	InitMS float64 `json:"init_ms"`
	// Consumers on the event stream after setup, and the stream's explicit limit.
	Consumers    int `json:"consumers"`
	MaxConsumers int `json:"max_consumers"`
	// Bound is the number of (deployment, tool) queue bindings: consume loops.
	Bound int `json:"queue_bindings"`
	// Saturated: throughput, and CPU and server messages per call.
	CallsPS      float64 `json:"calls_per_s"`
	CPUUSPerCall float64 `json:"cpu_us_per_call"`
	MsgsPerCall  float64 `json:"server_msgs_per_call"`
	// Idle: what the bound queues cost with no call in flight.
	IdleMsgsPerS float64 `json:"idle_server_msgs_per_s"`
	// IdleOutMsgsPerS is what the server sends per second while idle (the idle pulls'
	// heartbeats among them), beside IdleMsgsPerS, what it receives.
	IdleOutMsgsPerS float64 `json:"idle_server_out_msgs_per_s"`
	IdleCPUPct      float64 `json:"idle_cpu_percent_of_a_core"`
	// Parked is the number of bindings parked at the end of the idle window (their
	// queues idle for the deployments' ParkAfter: consume.Doorbell).
	Parked      int64  `json:"parked_bindings"`
	Redelivered int64  `json:"redelivered"`
	Trouble     string `json:"trouble,omitempty"`
	// IdleSubjects splits the idle messages per second by kind of subject, and Subjects
	// the saturated messages per call (with Options.Subjects).
	IdleSubjects map[string]float64 `json:"idle_msgs_per_s_by_subject,omitempty"`
	Subjects     map[string]float64 `json:"msgs_per_call_by_subject,omitempty"`
}

// ScaleOptions are the scale rows to measure: one per number of tools, each served by
// Deployments executor deployments (every tool by two of them, so deployments overlap).
type ScaleOptions struct {
	Tools       []int
	Deployments int
	K           int
	// Idle is how long the idle cost is measured (0: DefaultScaleIdle), once every
	// binding parked or ParkAfter and 10 s more passed.
	Idle time.Duration
	// ParkAfter is the deployments' worker.Config.ParkAfter (0: its default).
	ParkAfter time.Duration
}

// scaleTools names n tools.
func scaleTools(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("t%04d", i)
	}
	return out
}

// servedBy returns the tools deployment d of deps serves: tool t is served by
// deployments t mod deps and t+1 mod deps (and, with fewer tools than deployments,
// deployment d serves tool d mod n too), so every tool has two deployments and
// neighbouring deployments overlap.
func servedBy(names []string, d, deps int) []string {
	var out []string
	for t, name := range names {
		if t%deps == d || (t+1)%deps == d || (len(names) < deps && d%len(names) == t) {
			out = append(out, name)
		}
	}
	return out
}

// spreadScript asks for k calls per step for steps-1 steps, each of a tool picked by
// the run, the step and the call's index, so that the calls spread over every tool.
func spreadScript(names []string, k, steps int) planner.Model {
	return planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		if req.Step >= steps-1 {
			return planner.Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "done"}}, nil
		}
		h := fnv.New32a()
		_, _ = h.Write([]byte(req.RunID))
		base := int(h.Sum32()%uint32(len(names))) + req.Step*k
		calls := make([]toolbus.ToolCall, k)
		for i := range calls {
			calls[i] = toolbus.ToolCall{CallID: "c" + strconv.Itoa(i), Tool: names[(base+i)%len(names)], Arguments: `{}`}
		}
		return planner.Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}}, nil
	})
}

var scaleNoopResult any = json.RawMessage(`{}`)

// DefaultScaleIdle is how long the idle cost is measured: longer than a pull request's
// expiry (consume.PullExpiry), so that every bound queue renews its pull once in the
// window.
const DefaultScaleIdle = consume.PullExpiry + time.Second

// scaleStack is the pipeline of a scale row: the tools' queues set up, deployments
// serving them, a planner and an injector, on a server of its own.
type scaleStack struct {
	srv     *embedded.Server
	bus     *events.Bus
	nc      *nats.Conn
	names   []string
	trbl    *trouble
	log     *slog.Logger
	ended   chan string
	park    time.Duration // the deployments' ParkAfter
	wctx    context.Context
	wg      sync.WaitGroup
	cleanup []func()
}

func (st *scaleStack) close() {
	for i := len(st.cleanup) - 1; i >= 0; i-- {
		st.cleanup[i]()
	}
}

func (st *scaleStack) connect() (*nats.Conn, error) {
	nc, err := st.srv.Connect()
	if err == nil {
		st.cleanup = append(st.cleanup, nc.Close)
	}
	return nc, err
}

func (st *scaleStack) run(f func(context.Context) error) {
	st.wg.Add(1)
	go func() { defer st.wg.Done(); _ = f(st.wctx) }()
}

// benchScale measures one scale row on a server of its own.
func benchScale(ctx context.Context, storage string, tools int, so ScaleOptions, steps, runs int, subjects bool, cpuProfile string) (ScaleRow, error) {
	deps, k := so.Deployments, so.K
	row := ScaleRow{Storage: storage, Tools: tools, Deployments: deps, K: k, Steps: steps, Runs: runs}
	srv, stopServer, err := startServer(false)
	if err != nil {
		return row, err
	}
	defer stopServer()
	st := &scaleStack{srv: srv, names: scaleTools(tools), trbl: newTrouble(), ended: make(chan string, runs+1), park: so.ParkAfter}
	st.log = slog.New(st.trbl)
	defer st.close()
	wctx, stop := context.WithCancel(ctx)
	st.wctx = wctx
	st.cleanup = append(st.cleanup, func() { stop(); st.wg.Wait() })
	cfg := events.Config{Memory: storage == "memory", Stream: "TOOLBUS"}
	if err := st.setup(ctx, cfg, &row); err != nil {
		return row, err
	}
	if err := st.deploy(ctx, cfg, deps, &row); err != nil {
		return row, err
	}
	if err := st.workers(ctx, k, steps); err != nil {
		return row, err
	}
	prefix := fmt.Sprintf("s%d-%d-", tools, time.Now().UnixNano()%1e9)
	if err := st.start(ctx, prefix+"warm", steps); err != nil {
		return row, err
	}
	if err := st.wait(1); err != nil {
		return row, err
	}
	// Saturated first, while every queue still pulls (bound within ParkAfter): a queue
	// that parked costs one pull more when its next call wakes it (docs/performance.md).
	if err := st.saturate(ctx, prefix, k, steps, runs, subjects, cpuProfile, &row); err != nil {
		return row, err
	}
	idleProfile := ""
	if cpuProfile != "" {
		idleProfile = cpuProfile + "-idle"
	}
	if err := st.idle(ctx, cmp.Or(so.Idle, DefaultScaleIdle), subjects, idleProfile, &row); err != nil {
		return row, err
	}
	row.Redelivered, row.Trouble = st.trbl.summary()
	return row, nil
}

// setup sets up the stream, the buckets and a queue per tool, as `toolbus init` does,
// and times it.
func (st *scaleStack) setup(ctx context.Context, cfg events.Config, row *ScaleRow) error {
	nc, err := st.connect()
	if err != nil {
		return err
	}
	st.nc = nc
	t0 := time.Now()
	if st.bus, _, err = provision.Setup(ctx, nc, cfg, provision.WithTools(st.names, 0, 0)); err != nil {
		return err
	}
	row.InitMS = float64(time.Since(t0).Microseconds()) / 1000
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// The workers' durables on the event stream and the tools' queues on the queue
	// stream (each with the same limit).
	for _, name := range []string{cfg.Stream, events.QueueStreamName(cfg.Stream)} {
		if si, err := js.Stream(ctx, name); err == nil {
			row.Consumers += si.CachedInfo().State.Consumers
			row.MaxConsumers = si.CachedInfo().Config.MaxConsumers
		}
	}
	return nil
}

// deploy starts deps executor deployments, each on a connection of its own with the
// default concurrency, serving its tools (servedBy).
func (st *scaleStack) deploy(ctx context.Context, cfg events.Config, deps int, row *ScaleRow) error {
	for d := range deps {
		served := servedBy(st.names, d, deps)
		row.Bound += len(served)
		dnc, err := st.connect()
		if err != nil {
			return err
		}
		dbus, err := events.Open(ctx, dnc, cfg)
		if err != nil {
			return err
		}
		reg := executor.NewRegistry()
		for _, name := range served {
			if err := reg.Register(executor.Tool{Name: name, Description: "bench no-op", InputSchema: json.RawMessage(`{"type":"object"}`),
				ReadOnly: true, Func: func(context.Context, json.RawMessage) (any, error) { return scaleNoopResult, nil }}); err != nil {
				return err
			}
		}
		inst := "dep" + strconv.Itoa(d)
		exec, err := executor.New(reg, executor.WithLogger(st.log), executor.WithInstance(inst))
		if err != nil {
			return err
		}
		w, err := worker.New(dbus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: inst, Logger: st.log, Grace: time.Second}, Observer: st.trbl, ParkAfter: st.park})
		if err != nil {
			return err
		}
		st.run(w.Run)
	}
	return nil
}

// workers waits until every tool is in the catalog, then starts the planner (with a
// script that spreads the calls over the tools) and the injector.
func (st *scaleStack) workers(ctx context.Context, k, steps int) error {
	cat, err := st.bus.Store().WatchCatalog(st.wctx, st.log)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(2 * time.Minute); !st.allServed(cat); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("bench scale: the tools did not all reach the catalog in 2 minutes")
		}
	}
	wc := workerconfig.WorkerConfig{Instance: "bench", Concurrency: 256, Logger: st.log, Grace: time.Second}
	p, err := planner.New(st.bus, spreadScript(st.names, k, steps), cat, planner.Config{WorkerConfig: wc, Observer: st.trbl})
	if err != nil {
		return err
	}
	in, err := injector.New(st.bus, injector.Config{WorkerConfig: wc, Observer: st.trbl, Defaults: toolbus.DefaultLimits{MaxSteps: steps + 1}})
	if err != nil {
		return err
	}
	st.run(p.Run)
	st.run(in.Run)
	sub, err := st.nc.Subscribe("toolbus.*.run.*", func(m *nats.Msg) {
		if strings.Contains(m.Subject, ".run.started.") || strings.Contains(m.Subject, ".run.cancel.") {
			return
		}
		run, _ := events.RunIDFromSubject(m.Subject)
		st.ended <- run
	})
	if err != nil {
		return err
	}
	st.cleanup = append(st.cleanup, func() { _ = sub.Unsubscribe() })
	return nil
}

func (st *scaleStack) allServed(cat *store.Catalog) bool {
	for _, n := range st.names {
		if _, ok := cat.Lookup(n); !ok {
			return false
		}
	}
	return true
}

func (st *scaleStack) start(ctx context.Context, run string, steps int) error {
	return st.bus.StartRun(ctx, "/toolbus/bench/1", toolbus.RunStarted{RunID: run,
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "bench"}}, Limits: toolbus.Limits{MaxSteps: steps + 1}})
}

func (st *scaleStack) wait(n int) error {
	timeout := time.After(5 * time.Minute)
	for range n {
		select {
		case <-st.ended:
		case <-timeout:
			return errors.New("bench scale: runs did not finish in 5 minutes")
		}
	}
	return nil
}

// idle measures what the bound queues cost with no call in flight, once they parked
// and made the check that follows a park (or the time to park and 10 s more passed: a
// binding that cannot park is measured pulling).
func (st *scaleStack) idle(ctx context.Context, scaleIdle time.Duration, subjects bool, cpuProfile string, row *ScaleRow) error {
	settled := time.Now().Add(cmp.Or(st.park, consume.DefaultParkAfter) + 10*time.Second)
	for st.trbl.parked.Load() < int64(row.Bound) && time.Now().Before(settled) {
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-time.After(consume.ParkRecheck + time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	subj, stopProfile, err := st.window(subjects, cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	m0, c0 := serverMsgs(st.srv), cpuTime()
	o0 := serverOutMsgs(st.srv)
	select {
	case <-time.After(scaleIdle):
	case <-ctx.Done():
		return ctx.Err()
	}
	row.IdleMsgsPerS = float64(serverMsgs(st.srv)-m0) / scaleIdle.Seconds()
	row.IdleOutMsgsPerS = float64(serverOutMsgs(st.srv)-o0) / scaleIdle.Seconds()
	row.IdleCPUPct = 100 * (cpuTime() - c0).Seconds() / scaleIdle.Seconds()
	row.Parked = st.trbl.parked.Load()
	if subj != nil {
		row.IdleSubjects = subj.stop(scaleIdle.Seconds())
	}
	return nil
}

// window starts what a measurement watches, from the same moment: the count of
// messages per kind of subject (when subjects) and the CPU profile (when cpuProfile
// names a file); stopProfile ends the profile.
func (st *scaleStack) window(subjects bool, cpuProfile string) (subj *subjectCounter, stopProfile func(), err error) {
	if subjects {
		if subj, err = countSubjects(st.srv); err != nil {
			return nil, nil, err
		}
	}
	if stopProfile, err = startCPUProfile(cpuProfile); err != nil {
		return nil, nil, err
	}
	return subj, stopProfile, nil
}

// saturate starts runs runs at once and measures throughput, CPU and messages per call.
func (st *scaleStack) saturate(ctx context.Context, prefix string, k, steps, runs int, subjects bool, cpuProfile string, row *ScaleRow) error {
	subj, stopProfile, err := st.window(subjects, cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	m0, c0, t0 := serverMsgs(st.srv), cpuTime(), time.Now()
	for i := range runs {
		if err := st.start(ctx, prefix+"tp"+strconv.Itoa(i), steps); err != nil {
			return err
		}
	}
	if err := st.wait(runs); err != nil {
		return err
	}
	calls := float64(runs * (steps - 1) * k)
	row.CallsPS = calls / time.Since(t0).Seconds()
	row.CPUUSPerCall = float64((cpuTime() - c0).Microseconds()) / calls
	row.MsgsPerCall = float64(serverMsgs(st.srv)-m0) / calls
	if subj != nil {
		row.Subjects = subj.stop(calls)
	}
	return nil
}

// printScale writes the scale table.
func printScale(out io.Writer, rows []ScaleRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scale\ttools\tdeployments\tbindings\tK\tinit ms\tconsumers\tmax\truns\tcalls/s\tCPU us/call\tmsgs/call\tidle msgs/s\tidle out/s\tidle CPU %\tparked\tredelivered\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0f\t%d\t%d\t%d\t%.0f\t%.0f\t%.2f\t%.1f\t%.1f\t%.2f\t%d\t%d\t\n", r.Storage, r.Tools, r.Deployments, r.Bound, r.K,
			r.InitMS, r.Consumers, r.MaxConsumers, r.Runs, r.CallsPS, r.CPUUSPerCall, r.MsgsPerCall, r.IdleMsgsPerS, r.IdleOutMsgsPerS, r.IdleCPUPct, r.Parked, r.Redelivered)
	}
	tw.Flush()
	for _, r := range rows {
		if r.Trouble != "" {
			fmt.Fprintf(out, "scale %s %d tools: %s\n", r.Storage, r.Tools, r.Trouble)
		}
		name := fmt.Sprintf("scale %s %d tools", r.Storage, r.Tools)
		printSubjectCounts(out, name+", idle messages per second", r.IdleSubjects)
		printSubjectCounts(out, name+", messages per call", r.Subjects)
	}
}
