package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
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

// stack is a running pipeline: the one harness of the end-to-end, security and team
// tests. On an embedded server every role shares one connection (bus); on a server
// started from the shipped deploy/nats files (newSecuredStack) every role connects
// with its own credentials (buses, conns), and bus is the admin's.
type stack struct {
	t     *testing.T
	srv   *eventstest.Bus // nil on a secured server
	bus   *events.Bus
	reg   *executor.Registry
	model planner.Model
	ctx   context.Context
	log   *slog.Logger
	rules injector.Rules
	// deciders is the injector's decision policy (nil: anyone decides).
	deciders []string
	roles    *testutil.Group
	seenReq  *requestLog

	// With role credentials (newSecuredStack): each user's connection and bus, the
	// server's URL and each user's connect options, and the permission violations
	// the server sent to any of them.
	url   string
	opts  map[string][]nats.Option
	conns map[string]*nats.Conn
	buses map[string]*events.Bus
	viol  *violations
}

// busOf is the bus a role works on: its own under role credentials, else the shared one.
func (s *stack) busOf(role string) *events.Bus {
	if b, ok := s.buses[role]; ok {
		return b
	}
	return s.bus
}

// requestLog records every request the model received.
type requestLog struct {
	mu   sync.Mutex
	reqs []planner.Request
}

func (l *requestLog) wrap(m planner.Model) planner.Model {
	return planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		l.mu.Lock()
		l.reqs = append(l.reqs, req)
		l.mu.Unlock()
		return m.Complete(ctx, req)
	})
}

func (l *requestLog) forStep(run string, step int) (planner.Request, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.reqs {
		if r.RunID == run && r.Step == step {
			return r, true
		}
	}
	return planner.Request{}, false
}

func testLogger() *slog.Logger { return testutil.Logger() }

// newStack starts a bus with the demo and diag packs plus extra tools; roles are started
// separately so tests can stop and restart them.
func newStack(t *testing.T, model planner.Model, extra ...executor.Tool) *stack {
	t.Helper()
	return newStackOn(t, eventstest.RunJetStream(t), model, extra...)
}

// newStackOn is newStack on a server the test started.
func newStackOn(t *testing.T, srv *eventstest.Bus, model planner.Model, extra ...executor.Tool) *stack {
	t.Helper()
	return newStackOnWith(t, srv, events.Config{}, model, extra...)
}

// newStackOnWith is newStackOn with the bus set up from cfg.
func newStackOnWith(t *testing.T, srv *eventstest.Bus, cfg events.Config, model planner.Model, extra ...executor.Tool) *stack {
	t.Helper()
	ctx := eventstest.Context(t, 3*time.Minute)
	bus, _, err := provision.Setup(ctx, srv.Conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := newStackBare(t, ctx, model, extra...)
	s.srv, s.bus = srv, bus
	return s
}

// newStackBare is a stack with no bus yet: the registry (the demo and diag packs plus
// extra), the model (its requests recorded) and the roles' group.
func newStackBare(t *testing.T, ctx context.Context, model planner.Model, extra ...executor.Tool) *stack {
	t.Helper()
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo", "diag"); err != nil {
		t.Fatal(err)
	}
	for _, tool := range extra {
		if err := reg.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	s := &stack{t: t, reg: reg, ctx: ctx, log: testLogger(), roles: testutil.NewGroup(t, ctx), seenReq: &requestLog{}}
	s.model = s.seenReq.wrap(model)
	return s
}

// start runs a role under a name until stop(name) or the end of the test.
func (s *stack) start(name string, run func(ctx context.Context) error) { s.roles.Go(name, run) }

// stop stops the roles started under name and waits for them to return.
func (s *stack) stop(name string) { s.roles.Stop(name) }

func (s *stack) stopAll() { s.roles.StopAll() }

func (s *stack) startExecutor(name string, cfg worker.Config, opts ...executor.Option) {
	cfg.Instance = name
	cfg.Logger = s.log
	if cfg.Grace == 0 {
		cfg.Grace = time.Second
	}
	exec := must(executor.New(s.reg, append([]executor.Option{executor.WithLogger(s.log), executor.WithInstance(name)}, opts...)...))
	w := must(worker.New(s.busOf("executor"), exec, cfg))
	s.start(name, w.Run)
	// The planner must see every tool this executor serves before the first run.
	cat, err := s.bus.Store().WatchCatalog(s.ctx, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	served := cfg.Tools
	if len(served) == 0 {
		served = s.reg.Names()
	}
	eventstest.Eventually(s.t, 10*time.Second, func() error {
		for _, name := range served {
			if _, ok := cat.Lookup(name); !ok {
				return fmt.Errorf("tool %s not in the catalog yet", name)
			}
		}
		return nil
	})
}

func (s *stack) startPlanner(name string) {
	cat, err := s.busOf("planner").Store().WatchCatalog(s.ctx, s.log)
	if err != nil {
		s.t.Fatal(err)
	}
	p := must(planner.New(s.busOf("planner"), s.model, cat, planner.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: name, Logger: s.log, Grace: time.Second}}))
	s.start(name, p.Run)
}

func (s *stack) startInjector(name string) {
	in := must(injector.New(s.busOf("injector"), injector.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: name, Logger: s.log, Grace: time.Second}, Rules: s.rules, Deciders: s.deciders}))
	s.start(name, in.Run)
}

// startAll starts one executor, one planner and one injector.
func (s *stack) startAll() {
	s.startExecutor("executor-1", worker.Config{})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
}

// submit starts a run asking question, with the given limits.
func (s *stack) submit(run string, limits toolbus.Limits, allowed ...string) {
	s.t.Helper()
	err := s.bus.StartRun(s.ctx, events.Source("test", s.t.Name()), toolbus.RunStarted{
		RunID: run, Model: "test", Principal: toolbus.Principal{ID: "tester"}, AllowedTools: allowed, Limits: limits,
		Messages: []toolbus.Message{{Role: toolbus.RoleSystem, Content: "sys"}, {Role: toolbus.RoleUser, Content: "question for " + run}},
	})
	if err != nil {
		s.t.Fatal(err)
	}
}

// runEvents returns every event of a run in stream order.
func (s *stack) runEvents(run string) []runlog.StoredEvent {
	s.t.Helper()
	evs, err := runlog.Read(s.ctx, s.bus.EventStream(), events.SubjectRun(run))
	if err != nil {
		s.t.Fatal(err)
	}
	return evs
}

// walk visits a run's events in stream order; an event of a visited type whose data
// does not decode fails the test (messages that are not toolbus events are skipped:
// the hostile tests publish them).
func (s *stack) walk(run string, v audit.Visitor) {
	s.t.Helper()
	v.Undecodable = func(ev runlog.StoredEvent, err error) {
		if ev.Err == nil {
			s.t.Fatalf("%s #%d on %s: %v", ev.Meta.Type, ev.Seq, ev.Subject, err)
		}
	}
	v.Walk(s.runEvents(run))
}

// waitEnd waits for the run's outcome event of one of the given statuses.
func (s *stack) waitEnd(run string, statuses ...toolbus.RunStatus) toolbus.RunEnded {
	s.t.Helper()
	if len(statuses) == 0 {
		statuses = []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled, toolbus.RunWaitingForApproval}
	}
	var ended toolbus.RunEnded
	eventstest.Eventually(s.t, 150*time.Second, func() error {
		for _, st := range statuses {
			raw, err := s.bus.EventStream().GetLastMsgForSubject(s.ctx, events.SubjectRunEnded(run, st))
			if err != nil {
				continue
			}
			if err := jsonUnmarshalData(raw, &ended); err != nil {
				return err
			}
			return nil
		}
		return fmt.Errorf("run %s has no outcome in %v yet", run, statuses)
	})
	return ended
}

// finished returns the tool.finished results of a run in stream order.
func (s *stack) finished(run string) []toolbus.ToolFinished {
	var out []toolbus.ToolFinished
	s.walk(run, audit.Visitor{ToolFinished: func(_ runlog.StoredEvent, tf toolbus.ToolFinished) { out = append(out, tf) }})
	return out
}

func countType(evs []runlog.StoredEvent, typ string) int {
	n := 0
	for _, e := range evs {
		if e.Meta.Type == typ {
			n++
		}
	}
	return n
}

func toolRoles(msgs []toolbus.Message) string {
	var b strings.Builder
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(string(m.Role))
		if m.Role == toolbus.RoleTool {
			b.WriteString(":" + m.ToolCallID)
		}
	}
	return b.String()
}

// must returns what a worker constructor built (testutil.Must).
func must[T any](v T, err error) T { return testutil.Must(v, err) }
