package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/planner"
)

// The floor: the hops of a toolbus step on raw JetStream with no toolbus logic, and
// the in-process loop with no bus, the two figures the pipeline is measured beside.

// benchFloor runs the same hops per step as toolbus with raw JetStream and no toolbus
// logic: req -> K x call -> K x done -> next req, each a publish and a consume with ack.
func benchFloor(ctx context.Context, srv *embedded.Server, memory bool, k, steps, latRuns, runs int, redelivered *int64) ([]time.Duration, float64, time.Duration, error) {
	nc, err := srv.Connect()
	if err != nil {
		return nil, 0, 0, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st := jetstream.FileStorage
	if memory {
		st = jetstream.MemoryStorage
	}
	name := fmt.Sprintf("FLOOR%d_%d", k, time.Now().UnixNano()%1e9)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: st})
	if err != nil {
		return nil, 0, 0, err
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), name) //nolint:errcheck
	f := &floor{ctx: ctx, js: js, stream: stream, name: name, clock: &stepClock{times: map[string][]time.Time{}},
		ended: make(chan struct{}, runs+latRuns+1)}
	defer f.stop()
	if err := f.stages(k, steps); err != nil {
		return nil, 0, 0, err
	}
	defer func() { *redelivered = f.redel.Load() }()
	return f.measure(steps, latRuns, runs)
}

// floor is the pipeline of benchFloor: a stream and a durable consumer per stage.
type floor struct {
	ctx    context.Context
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	clock  *stepClock
	ended  chan struct{} // a run's last step arrived
	ccs    []jetstream.ConsumeContext
	redel  atomic.Int64 // deliveries after the first
}

// stages starts the three stages: a request publishes k calls (or ends the run at its
// last step), a call publishes its done, the k-th done of a step requests the next.
func (f *floor) stages(k, steps int) error {
	if err := f.stage("req", func(run string, step int) error {
		f.clock.mark(run, step)
		if step >= steps-1 {
			f.ended <- struct{}{}
			return nil
		}
		for range k {
			if err := f.pub("call", run, step); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := f.stage("call", func(run string, step int) error { return f.pub("done", run, step) }); err != nil {
		return err
	}
	var counts sync.Map // run.step -> *int32
	return f.stage("done", func(run string, step int) error {
		v, _ := counts.LoadOrStore(run+"."+strconv.Itoa(step), new(int32))
		if atomic.AddInt32(v.(*int32), 1) == int32(k) {
			return f.pub("req", run, step+1)
		}
		return nil
	})
}

// pub publishes a 200-byte message of a run's step to a stage.
func (f *floor) pub(stage, run string, step int) error {
	m := nats.NewMsg(f.name + "." + stage + "." + run)
	m.Header = nats.Header{"run": {run}, "step": {strconv.Itoa(step)}}
	m.Data = make([]byte, 200)
	_, err := f.js.PublishMsg(f.ctx, m)
	return err
}

// stage consumes a stage's messages, 256 at once, acknowledging each that h handled.
func (f *floor) stage(s string, h func(run string, step int) error) error {
	c, err := f.stream.CreateOrUpdateConsumer(f.ctx, jetstream.ConsumerConfig{Durable: s, FilterSubject: f.name + "." + s + ".>",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10000})
	if err != nil {
		return err
	}
	sem := make(chan struct{}, 256)
	cc, err := c.Consume(func(m jetstream.Msg) {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
				f.redel.Add(1)
			}
			step, _ := strconv.Atoi(m.Headers().Get("step"))
			if err := h(m.Headers().Get("run"), step); err == nil {
				_ = m.Ack()
			}
		}()
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		return err
	}
	f.ccs = append(f.ccs, cc)
	return nil
}

func (f *floor) stop() {
	for _, c := range f.ccs {
		c.Stop()
	}
}

// wait waits for n runs to end.
func (f *floor) wait(n int) error {
	timeout := time.After(5 * time.Minute)
	for range n {
		select {
		case <-f.ended:
		case <-timeout:
			return errors.New("floor runs did not finish")
		}
	}
	return nil
}

// measure runs latRuns runs one after the other (after a warm-up) for the step
// latencies, then runs runs at once for the throughput and the CPU time they took.
func (f *floor) measure(steps, latRuns, runs int) ([]time.Duration, float64, time.Duration, error) {
	var lat []time.Duration
	for i := range latRuns + 1 {
		run := "lat" + strconv.Itoa(i)
		if err := f.pub("req", run, 0); err != nil {
			return nil, 0, 0, err
		}
		if err := f.wait(1); err != nil {
			return nil, 0, 0, err
		}
		if i > 0 { // the first is a warm-up
			lat = append(lat, f.clock.latencies(run)...)
		}
	}
	t0, c0 := time.Now(), cpuTime()
	for i := range runs {
		if err := f.pub("req", "tp"+strconv.Itoa(i), 0); err != nil {
			return nil, 0, 0, err
		}
	}
	if err := f.wait(runs); err != nil {
		return nil, 0, 0, err
	}
	return lat, float64(runs*(steps-1)) / time.Since(t0).Seconds(), cpuTime() - c0, nil
}

// benchInproc runs the same workload as a direct loop: model, then the K calls through
// the same executor, then the history append; no bus.
func benchInproc(ctx context.Context, k, steps, latRuns, runs int) ([]time.Duration, float64) {
	reg := executor.NewRegistry()
	_ = packs.Register(reg, "diag")
	exec, err := executor.New(reg, executor.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		panic(err) // no option that can be out of range
	}
	model := NoopScript(k, steps)
	oneRun := func(run string, lat *[]time.Duration) {
		msgs := []toolbus.Message{{Role: toolbus.RoleUser, Content: "bench"}}
		last := time.Now()
		for step := 0; step < steps; step++ {
			resp, _ := model.Complete(ctx, planner.Request{RunID: run, Step: step, Messages: msgs})
			now := time.Now()
			if step > 0 && lat != nil {
				*lat = append(*lat, now.Sub(last))
			}
			last = now
			msgs = append(msgs, resp.Message)
			if len(resp.Message.ToolCalls) == 0 {
				return
			}
			results := make([]toolbus.ToolResult, len(resp.Message.ToolCalls))
			var wg sync.WaitGroup
			for i, c := range resp.Message.ToolCalls {
				wg.Add(1)
				go func() { defer wg.Done(); results[i] = exec.Execute(ctx, c, toolbus.Principal{}) }()
			}
			wg.Wait()
			for _, r := range results {
				msgs = append(msgs, toolbus.ToolMessage(r))
			}
		}
	}
	var lat []time.Duration
	for i := 0; i < latRuns*5; i++ {
		oneRun("lat", &lat)
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); oneRun("tp", nil) }()
	}
	wg.Wait()
	return lat, float64(runs*(steps-1)) / time.Since(t0).Seconds()
}
