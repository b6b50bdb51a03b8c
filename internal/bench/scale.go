package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
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
	"github.com/toolbus/toolbus/events/store"
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
	IdleCPUPct   float64 `json:"idle_cpu_percent_of_a_core"`
	Redelivered  int64   `json:"redelivered"`
	Trouble      string  `json:"trouble,omitempty"`
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

// benchScale measures one scale row on a server of its own.
func benchScale(ctx context.Context, storage string, tools, deps, k, steps, runs int, subjects bool, cpuProfile string) (ScaleRow, error) {
	row := ScaleRow{Storage: storage, Tools: tools, Deployments: deps, K: k, Steps: steps, Runs: runs}
	dir, err := os.MkdirTemp("", "toolbus-bench-scale-")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		return row, err
	}
	defer srv.Stop()
	cfg := events.Config{Memory: storage == "memory", Stream: "TOOLBUS"}
	names := scaleTools(tools)

	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	connect := func() (*nats.Conn, error) {
		nc, err := srv.Connect()
		if err == nil {
			cleanup = append(cleanup, nc.Close)
		}
		return nc, err
	}
	nc, err := connect()
	if err != nil {
		return row, err
	}
	t0 := time.Now()
	bus, _, err := events.Setup(ctx, nc, cfg, events.SetupTools(names, 0, 0))
	if err != nil {
		return row, err
	}
	row.InitMS = float64(time.Since(t0).Microseconds()) / 1000
	js, err := jetstream.New(nc)
	if err != nil {
		return row, err
	}
	if si, err := js.Stream(ctx, cfg.Stream); err == nil {
		row.Consumers, row.MaxConsumers = si.CachedInfo().State.Consumers, si.CachedInfo().Config.MaxConsumers
	}

	trbl := newTrouble()
	log := slog.New(trbl)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	cleanup = append(cleanup, func() { stop(); wg.Wait() })
	runW := func(f func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); _ = f(wctx) }()
	}
	for d := range deps {
		served := servedBy(names, d, deps)
		row.Bound += len(served)
		dnc, err := connect()
		if err != nil {
			return row, err
		}
		dbus, err := events.Open(ctx, dnc, cfg)
		if err != nil {
			return row, err
		}
		reg := executor.NewRegistry()
		for _, name := range served {
			if err := reg.Register(executor.Tool{Name: name, Description: "bench no-op", InputSchema: json.RawMessage(`{"type":"object"}`),
				ReadOnly: true, Func: func(context.Context, json.RawMessage) (any, error) { return scaleNoopResult, nil }}); err != nil {
				return row, err
			}
		}
		inst := "dep" + strconv.Itoa(d)
		exec, err := executor.New(reg, executor.WithLogger(log), executor.WithInstance(inst))
		if err != nil {
			return row, err
		}
		w, err := worker.New(dbus, exec, worker.Config{WorkerConfig: events.WorkerConfig{Instance: inst, Logger: log, Grace: time.Second}, Observer: trbl})
		if err != nil {
			return row, err
		}
		runW(w.Run)
	}
	var cat *store.Catalog
	if cat, err = bus.WatchCatalog(wctx, log); err != nil {
		return row, err
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		all := true
		for _, n := range names {
			if _, ok := cat.Lookup(n); !ok {
				all = false
				break
			}
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			return row, errors.New("bench scale: the tools did not all reach the catalog in 2 minutes")
		}
	}
	wc := events.WorkerConfig{Instance: "bench", Concurrency: 256, Logger: log, Grace: time.Second}
	p, err := planner.New(bus, spreadScript(names, k, steps), cat, planner.Config{WorkerConfig: wc, Observer: trbl})
	if err != nil {
		return row, err
	}
	in, err := injector.New(bus, injector.Config{WorkerConfig: wc, Observer: trbl, Defaults: toolbus.DefaultLimits{MaxSteps: steps + 1}})
	if err != nil {
		return row, err
	}
	runW(p.Run)
	runW(in.Run)
	ended := make(chan string, runs+1)
	sub, err := nc.Subscribe("toolbus.*.run.*", func(m *nats.Msg) {
		if strings.Contains(m.Subject, ".run.started.") || strings.Contains(m.Subject, ".run.cancel.") {
			return
		}
		run, _ := events.RunIDFromSubject(m.Subject)
		ended <- run
	})
	if err != nil {
		return row, err
	}
	cleanup = append(cleanup, func() { _ = sub.Unsubscribe() })
	start := func(run string) error {
		return bus.StartRun(ctx, "/toolbus/bench/1", toolbus.RunStarted{RunID: run,
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "bench"}}, Limits: toolbus.Limits{MaxSteps: steps + 1}})
	}
	wait := func(n int) error {
		timeout := time.After(5 * time.Minute)
		for range n {
			select {
			case <-ended:
			case <-timeout:
				return errors.New("bench scale: runs did not finish in 5 minutes")
			}
		}
		return nil
	}
	prefix := fmt.Sprintf("s%d-%d-", tools, time.Now().UnixNano()%1e9)
	if err := start(prefix + "warm"); err != nil {
		return row, err
	}
	if err := wait(1); err != nil {
		return row, err
	}

	// Idle: every queue bound, nothing to do.
	const idle = 5 * time.Second
	var subj *subjectCounter
	if subjects {
		if subj, err = countSubjects(srv); err != nil {
			return row, err
		}
	}
	m0, c0 := serverMsgs(srv), cpuTime()
	select {
	case <-time.After(idle):
	case <-ctx.Done():
		return row, ctx.Err()
	}
	row.IdleMsgsPerS = float64(serverMsgs(srv)-m0) / idle.Seconds()
	row.IdleCPUPct = 100 * (cpuTime() - c0).Seconds() / idle.Seconds()
	if subj != nil {
		row.IdleSubjects = subj.stop(idle.Seconds())
		if subj, err = countSubjects(srv); err != nil {
			return row, err
		}
	}

	// Saturated.
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return row, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return row, err
		}
		defer pprof.StopCPUProfile()
	}
	m0, c0 = serverMsgs(srv), cpuTime()
	t0 = time.Now()
	for i := range runs {
		if err := start(prefix + "tp" + strconv.Itoa(i)); err != nil {
			return row, err
		}
	}
	if err := wait(runs); err != nil {
		return row, err
	}
	calls := float64(runs * (steps - 1) * k)
	row.CallsPS = calls / time.Since(t0).Seconds()
	row.CPUUSPerCall = float64((cpuTime() - c0).Microseconds()) / calls
	row.MsgsPerCall = float64(serverMsgs(srv)-m0) / calls
	row.Redelivered, row.Trouble = trbl.summary()
	if subj != nil {
		row.Subjects = subj.stop(calls)
	}
	return row, nil
}

// printScale writes the scale table.
func printScale(out io.Writer, rows []ScaleRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scale\ttools\tdeployments\tbindings\tK\tinit ms\tconsumers\tmax\truns\tcalls/s\tCPU us/call\tmsgs/call\tidle msgs/s\tidle CPU %\tredelivered\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0f\t%d\t%d\t%d\t%.0f\t%.0f\t%.2f\t%.1f\t%.2f\t%d\t\n", r.Storage, r.Tools, r.Deployments, r.Bound, r.K,
			r.InitMS, r.Consumers, r.MaxConsumers, r.Runs, r.CallsPS, r.CPUUSPerCall, r.MsgsPerCall, r.IdleMsgsPerS, r.IdleCPUPct, r.Redelivered)
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
