package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/internal/testpipe"
	"github.com/toolbus/toolbus/planner"
)

// pipeline is a whole pipeline (executor, planner, injector) on an embedded server: the
// runs the console shows. Its model follows a script per run id.
type pipeline struct {
	*testpipe.Pipeline
	t   *testing.T
	ctx context.Context
	srv *eventstest.Bus
	bus *events.Bus
}

// pipelineDeadline bounds a pipeline's life (its workers stop then); a load test raises
// it. No test of this package runs in parallel.
var pipelineDeadline = 5 * time.Minute

// startPipeline starts the workers on a fresh server: the demo and diag packs and extra
// tools on one executor instance ("exec-1"), a planner whose model follows scripts by
// run id, and an injector.
func startPipeline(t *testing.T, scripts map[string]*planner.Script, extra ...executor.Tool) *pipeline {
	t.Helper()
	tp := testpipe.Start(t, pipelineDeadline, testpipe.ScriptByRun(scripts, nil), extra...)
	return &pipeline{Pipeline: tp, t: t, ctx: tp.Ctx, srv: tp.Srv, bus: tp.Bus}
}

// startPipelineOn is startPipeline on a connection that may set the bus up (admin): its
// pipeline has no testpipe.Pipeline (the helpers below read the bus).
func startPipelineOn(t *testing.T, nc *nats.Conn, scripts map[string]*planner.Script, extra ...executor.Tool) *pipeline {
	t.Helper()
	ctx := eventstest.Context(t, pipelineDeadline)
	bus, _, err := provision.Setup(ctx, nc, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := &pipeline{t: t, ctx: ctx, bus: bus}
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo", "diag"); err != nil {
		t.Fatal(err)
	}
	for _, tool := range extra {
		if err := reg.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	serve := func(w interface{ Run(context.Context) error }, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(wctx); err != nil && wctx.Err() == nil {
				t.Errorf("worker: %v", err)
			}
		}()
	}
	exec, err := executor.New(reg, executor.WithLogger(log), executor.WithInstance("exec-1"))
	if err != nil {
		t.Fatal(err)
	}
	serve(worker.New(bus, exec, worker.Config{WorkerConfig: events.WorkerConfig{Instance: "exec-1", Logger: log, Grace: time.Second}}))
	// Deadlines are generous: the tests share a loaded machine.
	eventstest.Eventually(t, time.Minute, func() error {
		cat, err := bus.Store().WatchCatalog(ctx, nil)
		if err != nil {
			return err
		}
		if _, ok := cat.Lookup("noop"); !ok {
			return fmt.Errorf("catalog not published yet")
		}
		return nil
	})
	cat, err := bus.Store().WatchCatalog(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	model := planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		s, ok := scripts[req.RunID]
		if !ok {
			return planner.Response{}, planner.Permanent(fmt.Errorf("no script for %s", req.RunID))
		}
		return s.Complete(ctx, req)
	})
	serve(planner.New(bus, model, cat, planner.Config{WorkerConfig: events.WorkerConfig{Instance: "planner-1", Logger: log, Grace: time.Second}}))
	serve(injector.New(bus, injector.Config{WorkerConfig: events.WorkerConfig{Instance: "injector-1", Logger: log, Grace: time.Second}}))
	return p
}

// submit starts run with the question "question for <run>" (principal "tester").
func (p *pipeline) submit(run string, limits toolbus.Limits) {
	p.t.Helper()
	p.submitAs(run, "tester", "question for "+run, limits)
}

// submitAs starts run for principal with question.
func (p *pipeline) submitAs(run, principal, question string, limits toolbus.Limits) {
	p.t.Helper()
	if err := p.bus.StartRun(p.ctx, "/test", toolbus.RunStarted{
		RunID: run, Model: "script", Principal: toolbus.Principal{ID: principal}, Limits: limits,
		Messages: []toolbus.Message{{Role: toolbus.RoleSystem, Content: "sys"}, {Role: toolbus.RoleUser, Content: question}},
	}); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pipeline) waitStatus(run string, want toolbus.RunStatus) {
	p.t.Helper()
	eventstest.Eventually(p.t, time.Minute, func() error {
		st, _, err := p.bus.Store().RunState(p.ctx, run)
		if err != nil {
			return err
		}
		if st.Status != want {
			return fmt.Errorf("run %s is %s, want %s", run, st.Status, want)
		}
		return nil
	})
}

// waitEvent waits until the run has an event of type typ.
func (p *pipeline) waitEvent(run, typ string) {
	p.t.Helper()
	eventstest.Eventually(p.t, time.Minute, func() error {
		evs, err := p.bus.RunEvents(p.ctx, run)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Meta.Type == typ {
				return nil
			}
		}
		return fmt.Errorf("run %s has no %s yet", run, typ)
	})
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Fatalf("%s: output lacks %q:\n%s", what, w, got)
		}
	}
}

// deployTool deploys a service and needs approval.
func deployTool() executor.Tool {
	return executor.Tool{
		Name: "deploy", Description: "deploys a service (needs approval)", NeedsApproval: true,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"service":{"type":"string"}}}`),
		Func: func(_ context.Context, args json.RawMessage) (any, error) {
			var in struct{ Service string }
			_ = json.Unmarshal(args, &in)
			return map[string]string{"deployed": in.Service}, nil
		},
	}
}

func call(id, tool, args string) toolbus.ToolCall {
	return toolbus.ToolCall{CallID: id, Tool: tool, Arguments: args}
}

// crawlTool is a long-running tool that reports progress every 50ms until release is
// closed, then answers.
func crawlTool(release <-chan struct{}) executor.Tool {
	return executor.Tool{Name: "crawl", Description: "crawls until released, reporting progress", ReadOnly: true,
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 2 * time.Minute, HeartbeatTimeout: 10 * time.Second,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			for n := 1; ; n++ {
				if err := executor.Progress(ctx, float64(n), 0, fmt.Sprintf("page %d", n)); err != nil {
					return nil, err
				}
				select {
				case <-release:
					return "crawled", nil
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		}}
}
