package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/planner"
)

// inflight counts calls running inside tools and keeps the highest count seen.
type inflight struct{ cur, peak atomic.Int64 }

func (g *inflight) enter() {
	n := g.cur.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (g *inflight) leave() { g.cur.Add(-1) }

// bpWorker is one executor worker with its own registry, so its tools see only its calls.
type bpWorker struct {
	name      string
	all       inflight // every call of this worker
	limited   inflight // calls of bp_limited on this worker
	calls     atomic.Int64
	registry  *executor.Registry
	executor  *executor.Executor
	workerCfg worker.Config
}

// newBPWorker returns a worker whose probes hold each call until their gate opens, so a
// test can wait for saturation instead of hoping for it.
func newBPWorker(t *testing.T, name string, concurrency, toolLimit int, freeGate, limitedGate <-chan struct{}) *bpWorker {
	w := &bpWorker{name: name, registry: executor.NewRegistry()}
	body := func(gate <-chan struct{}, gauges ...*inflight) executor.Func {
		return func(ctx context.Context, _ json.RawMessage) (any, error) {
			for _, g := range gauges {
				g.enter()
			}
			defer func() {
				for _, g := range gauges {
					g.leave()
				}
			}()
			w.calls.Add(1)
			select {
			case <-gate:
				return map[string]string{"worker": name}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	for _, tool := range []executor.Tool{
		{Name: "bp_free", Description: "back-pressure probe", InputSchema: objectSchema, ReadOnly: true,
			Timeout: 2 * time.Minute, Func: body(freeGate, &w.all)},
		{Name: "bp_limited", Description: "back-pressure probe with a per-tool limit", InputSchema: objectSchema, ReadOnly: true,
			MaxConcurrency: toolLimit, Timeout: 2 * time.Minute, Func: body(limitedGate, &w.all, &w.limited)},
	} {
		if err := w.registry.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	w.executor = must(executor.New(w.registry, executor.WithInstance(name)))
	w.workerCfg = worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: name, Concurrency: concurrency, Grace: time.Second}}
	return w
}

// A worker never runs more calls at once than its concurrency, and never more calls of
// a tool than the tool's MaxConcurrency, however many calls wait on the bus: measured
// inside the tools, per worker. The probes hold their calls until the test has seen
// every worker saturated (no reliance on timing): first 10 runs of 8 bp_free calls fill
// every worker to its concurrency, then 10 runs of 8 bp_limited calls fill every worker
// to the tool's limit.
func TestBackPressureLimits(t *testing.T) {
	t.Parallel()
	const (
		workerLimit = 4
		toolLimit   = 2
		runs        = 10
		calls       = 8
	)
	model := planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		if req.Step > 0 {
			return planner.Answer("done")(req), nil
		}
		tool := "bp_free"
		if strings.HasPrefix(req.RunID, "lim-") {
			tool = "bp_limited"
		}
		cs := make([]toolbus.ToolCall, calls)
		for i := range cs {
			cs[i] = call("c"+strconv.Itoa(i), tool, `{}`)
		}
		return planner.Calls(cs...)(req), nil
	})
	s := newStack(t, model)
	freeGate, limitedGate := make(chan struct{}), make(chan struct{})
	workers := []*bpWorker{
		newBPWorker(t, "bp-1", workerLimit, toolLimit, freeGate, limitedGate),
		newBPWorker(t, "bp-2", workerLimit, toolLimit, freeGate, limitedGate),
	}
	for _, w := range workers {
		cfg := w.workerCfg
		cfg.Logger = s.log
		s.start(w.name, must(worker.New(s.bus, w.executor, cfg)).Run)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		cat, err := s.bus.Store().WatchCatalog(s.ctx, nil)
		if err != nil {
			return err
		}
		if len(cat.Serving("bp_limited")) != len(workers) || len(cat.Serving("bp_free")) != len(workers) {
			return errors.New("not every worker serves the probes yet")
		}
		return nil
	})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	phase := func(prefix string, gate chan struct{}, gauge func(*bpWorker) *inflight, limit int64) {
		t.Helper()
		for i := 0; i < runs; i++ {
			s.submit(prefix+strconv.Itoa(i), toolbus.Limits{})
		}
		eventstest.Eventually(t, time.Minute, func() error {
			for _, w := range workers {
				if n := gauge(w).cur.Load(); n != limit {
					return fmt.Errorf("%s holds %d calls, want %d", w.name, n, limit)
				}
			}
			return nil
		})
		close(gate)
		for i := 0; i < runs; i++ {
			run := prefix + strconv.Itoa(i)
			if ended := s.waitEnd(run); ended.Status != toolbus.RunCompleted {
				t.Fatalf("%s: %s (%s)", run, ended.Status, ended.Reason)
			}
		}
	}
	phase("free-", freeGate, func(w *bpWorker) *inflight { return &w.all }, workerLimit)
	phase("lim-", limitedGate, func(w *bpWorker) *inflight { return &w.limited }, toolLimit)
	total := int64(0)
	for _, w := range workers {
		all, limited, n := w.all.peak.Load(), w.limited.peak.Load(), w.calls.Load()
		total += n
		t.Logf("%s: %d calls, at most %d at once (limit %d), at most %d of bp_limited at once (limit %d)",
			w.name, n, all, workerLimit, limited, toolLimit)
		if all > workerLimit {
			t.Errorf("%s ran %d calls at once, more than its concurrency %d", w.name, all, workerLimit)
		}
		if limited > toolLimit {
			t.Errorf("%s ran %d calls of bp_limited at once, more than its MaxConcurrency %d", w.name, limited, toolLimit)
		}
	}
	if total != 2*runs*calls {
		t.Fatalf("%d calls ran, want %d", total, 2*runs*calls)
	}
}
