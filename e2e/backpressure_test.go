package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
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
	workerCfg executor.WorkerConfig
}

func newBPWorker(t *testing.T, name string, concurrency, toolLimit int) *bpWorker {
	w := &bpWorker{name: name, registry: executor.NewRegistry()}
	body := func(gauges ...*inflight) executor.Func {
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
			t := time.NewTimer(15 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				return map[string]string{"worker": name}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	for _, tool := range []executor.Tool{
		{Name: "bp_free", Description: "back-pressure probe", InputSchema: objectSchema, ReadOnly: true, Func: body(&w.all)},
		{Name: "bp_limited", Description: "back-pressure probe with a per-tool limit", InputSchema: objectSchema, ReadOnly: true,
			MaxConcurrency: toolLimit, Func: body(&w.all, &w.limited)},
	} {
		if err := w.registry.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	w.executor = executor.New(w.registry, executor.WithInstance(name))
	w.workerCfg = executor.WorkerConfig{Instance: name, Concurrency: concurrency, Grace: time.Second}
	return w
}

// A worker never runs more calls at once than its concurrency, and never more calls of
// a tool than the tool's MaxConcurrency, however many calls wait on the bus: measured
// inside the tools, per worker, while 40 runs of 8 calls saturate two workers.
func TestBackPressureLimits(t *testing.T) {
	const (
		workerLimit = 4
		toolLimit   = 2
		runs        = 40
	)
	var calls []events.ToolCall
	for i := 0; i < 8; i++ {
		tool := "bp_free"
		if i%2 == 1 {
			tool = "bp_limited"
		}
		calls = append(calls, call("c"+strconv.Itoa(i), tool, `{}`))
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{planner.Calls(calls...), planner.Answer("done")}}
	s := newStack(t, model)
	workers := []*bpWorker{
		newBPWorker(t, "bp-1", workerLimit, toolLimit),
		newBPWorker(t, "bp-2", workerLimit, toolLimit),
	}
	for _, w := range workers {
		cfg := w.workerCfg
		cfg.Logger = s.log
		s.start(w.name, executor.NewWorker(s.bus, w.executor, cfg).Run)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		cat, err := s.bus.WatchCatalog(s.ctx, nil)
		if err != nil {
			return err
		}
		if _, ok := cat.Lookup("bp_limited"); !ok {
			return errors.New("catalog without bp_limited")
		}
		return nil
	})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	for i := 0; i < runs; i++ {
		s.submit("bp-"+strconv.Itoa(i), events.Limits{})
	}
	for i := 0; i < runs; i++ {
		run := "bp-" + strconv.Itoa(i)
		if ended := s.waitEnd(run); ended.Status != events.RunCompleted {
			t.Fatalf("%s: %s (%s)", run, ended.Status, ended.Reason)
		}
	}
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
		// The probes must have been saturated, or the limits were not tested.
		if all < workerLimit || limited < toolLimit {
			t.Errorf("%s never reached its limits (%d of %d, %d of %d): the test did not saturate it", w.name, all, workerLimit, limited, toolLimit)
		}
	}
	if total != runs*int64(len(calls)) {
		t.Fatalf("%d calls ran, want %d", total, runs*len(calls))
	}
}
