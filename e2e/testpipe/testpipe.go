// Package testpipe runs a whole pipeline for tests: an embedded server with the stream
// and buckets set up, an executor serving the demo and diag packs (plus the test's own
// tools), a planner with the test's model and an injector. The command's and the
// console's tests drive it; the end-to-end tests build their richer stack on the same
// pieces (eventstest, testutil.Group).
package testpipe

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// Pipeline is a running pipeline; its roles stop at the end of the test.
type Pipeline struct {
	t *testing.T
	// Srv is the embedded server (nil: StartOn, on the test's own connection).
	Srv   *eventstest.Bus
	Bus   *events.Bus
	Ctx   context.Context // ends after the deadline given to Start
	Log   *slog.Logger
	Roles *testutil.Group // exec-1, planner-1, injector-1
}

// Start starts a pipeline that lives at most d; model plans every run, extra tools are
// served beside the demo and diag packs. It returns once the planner's catalog has the
// executor's tools.
func Start(t *testing.T, d time.Duration, model planner.Model, extra ...executor.Tool) *Pipeline {
	t.Helper()
	return StartWith(t, d, model, Options{}, extra...)
}

// Options are a pipeline's settings beyond the defaults.
type Options struct {
	// Quota is the injector's.
	Quota injector.Quota
	// Deciders is the injector's decision policy (nil: anyone decides).
	Deciders []string
	// Bus sets the stream and buckets up.
	Bus events.Config
}

// StartWith is Start with opts.
func StartWith(t *testing.T, d time.Duration, model planner.Model, opts Options, extra ...executor.Tool) *Pipeline {
	t.Helper()
	srv := eventstest.RunJetStream(t)
	p := startOn(t, srv.Conn, d, model, opts, extra...)
	p.Srv = srv
	return p
}

// StartOn is Start on the test's own connection nc (to a server it runs with its own
// accounts or permissions), which must be allowed to set the bus up.
func StartOn(t *testing.T, nc *nats.Conn, d time.Duration, model planner.Model, extra ...executor.Tool) *Pipeline {
	t.Helper()
	return startOn(t, nc, d, model, Options{}, extra...)
}

// StartOnWith is StartOn with opts (opts.Bus sets the bus up on nc).
func StartOnWith(t *testing.T, nc *nats.Conn, d time.Duration, model planner.Model, opts Options, extra ...executor.Tool) *Pipeline {
	t.Helper()
	return startOn(t, nc, d, model, opts, extra...)
}

func startOn(t *testing.T, nc *nats.Conn, d time.Duration, model planner.Model, opts Options, extra ...executor.Tool) *Pipeline {
	t.Helper()
	ctx := eventstest.Context(t, d)
	bus, _, err := provision.Setup(ctx, nc, opts.Bus)
	if err != nil {
		t.Fatal(err)
	}
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo", "diag"); err != nil {
		t.Fatal(err)
	}
	for _, tool := range extra {
		if err := reg.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	p := &Pipeline{t: t, Bus: bus, Ctx: ctx, Log: testutil.Logger(), Roles: testutil.NewGroup(t, ctx)}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(p.Log), executor.WithInstance("exec-1")))
	p.Roles.Go("exec-1", testutil.Must(worker.New(bus, exec, worker.Config{WorkerConfig: p.worker("exec-1")})).Run)
	// Every tool, not only the first: a run may call any of them at once. The executor
	// publishes them one by one, which takes a while on a busy machine.
	cat, err := bus.Store().WatchCatalog(ctx, p.Log)
	if err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		for _, name := range reg.Names() {
			if _, ok := cat.Lookup(name); !ok {
				return fmt.Errorf("%s not in the catalog yet", name)
			}
		}
		return nil
	})
	p.Roles.Go("planner-1", testutil.Must(planner.New(bus, model, cat, planner.Config{WorkerConfig: p.worker("planner-1")})).Run)
	p.Roles.Go("injector-1", testutil.Must(injector.New(bus, injector.Config{WorkerConfig: p.worker("injector-1"), Quota: opts.Quota, Deciders: opts.Deciders})).Run)
	return p
}

func (p *Pipeline) worker(instance string) workerconfig.WorkerConfig {
	return workerconfig.WorkerConfig{Instance: instance, Logger: p.Log, Grace: time.Second}
}

// ScriptByRun is a model that plans each run with the script named by its run id; a run
// with no script fails (a permanent model error). seen, when not nil, is called with
// every request first.
func ScriptByRun(scripts map[string]*planner.Script, seen func(planner.Request)) planner.Model {
	return planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		if seen != nil {
			seen(req)
		}
		s, ok := scripts[req.RunID]
		if !ok {
			return planner.Response{}, planner.Permanent(fmt.Errorf("no script for %s", req.RunID))
		}
		return s.Complete(ctx, req)
	})
}

// SubmitAs starts run for principal with question (and the system message "sys").
func (p *Pipeline) SubmitAs(run, principal, question string, limits toolbus.Limits) {
	p.t.Helper()
	if err := p.Bus.StartRun(p.Ctx, "/test", toolbus.RunStarted{
		RunID: run, Model: "script", Principal: toolbus.Principal{ID: principal}, Limits: limits,
		Messages: []toolbus.Message{{Role: toolbus.RoleSystem, Content: "sys"}, {Role: toolbus.RoleUser, Content: question}},
	}); err != nil {
		p.t.Fatal(err)
	}
}

// WaitStatus waits (a minute at most: the tests share a loaded machine) until the run's
// state is want.
func (p *Pipeline) WaitStatus(run string, want toolbus.RunStatus) {
	p.t.Helper()
	eventstest.Eventually(p.t, time.Minute, func() error {
		st, _, err := p.Bus.Store().RunState(p.Ctx, run)
		if err != nil {
			return err
		}
		if st.Status != want {
			return fmt.Errorf("run %s is %s (%s: %s), want %s", run, st.Status, st.Code, st.Reason, want)
		}
		return nil
	})
}

// WaitTools waits until the catalog has every tool named: the planner rejects a call of
// a tool it cannot find there (unknown_tool), so a test that starts its own executor
// submits only once that executor has published its tools.
func (p *Pipeline) WaitTools(names ...string) {
	p.t.Helper()
	eventstest.Eventually(p.t, time.Minute, func() error {
		for _, name := range names {
			if _, err := p.Bus.Store().Contract(p.Ctx, name); err != nil {
				return fmt.Errorf("tool %s: %w", name, err)
			}
		}
		return nil
	})
}

// WaitEvent waits until the run has an event of type typ.
func (p *Pipeline) WaitEvent(run, typ string) {
	p.t.Helper()
	eventstest.Eventually(p.t, time.Minute, func() error {
		evs, err := runlog.Events(p.Ctx, p.Bus, run)
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
