package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// stack is a running pipeline on an embedded server.
type stack struct {
	t       *testing.T
	srv     *eventstest.Bus
	bus     *events.Bus
	reg     *executor.Registry
	model   planner.Model
	ctx     context.Context
	log     *slog.Logger
	rules   injector.Rules
	mu      sync.Mutex
	stops   map[string]func()
	seenReq *requestLog
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

func testLogger() *slog.Logger {
	if os.Getenv("TOOLBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newStack starts a bus with the demo and diag packs plus extra tools; roles are started
// separately so tests can stop and restart them.
func newStack(t *testing.T, model planner.Model, extra ...executor.Tool) *stack {
	t.Helper()
	return newStackOn(t, eventstest.RunJetStream(t), model, extra...)
}

// start runs a role under a name until stop(name) or the end of the test.
func (s *stack) start(name string, run func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil && ctx.Err() == nil {
			s.t.Errorf("%s: %v", name, err)
		}
	}()
	s.mu.Lock()
	s.stops[name] = func() { cancel(); <-done }
	s.mu.Unlock()
}

func (s *stack) stop(name string) {
	s.mu.Lock()
	f := s.stops[name]
	delete(s.stops, name)
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

func (s *stack) stopAll() {
	s.mu.Lock()
	names := make([]string, 0, len(s.stops))
	for n := range s.stops {
		names = append(names, n)
	}
	s.mu.Unlock()
	for _, n := range names {
		s.stop(n)
	}
}

func (s *stack) startExecutor(name string, cfg worker.Config) {
	cfg.Instance = name
	cfg.Logger = s.log
	if cfg.Grace == 0 {
		cfg.Grace = time.Second
	}
	exec := executor.New(s.reg, executor.WithLogger(s.log), executor.WithInstance(name))
	w := worker.New(s.bus, exec, cfg)
	s.start(name, w.Run)
	// The planner must see every tool this executor serves before the first run.
	cat, err := s.bus.WatchCatalog(s.ctx, nil)
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
	cat, err := s.bus.WatchCatalog(s.ctx, s.log)
	if err != nil {
		s.t.Fatal(err)
	}
	p := planner.New(s.bus, s.model, cat, planner.Config{Instance: name, Logger: s.log, Grace: time.Second})
	s.start(name, p.Run)
}

func (s *stack) startInjector(name string) {
	in := injector.New(s.bus, injector.Config{Instance: name, Logger: s.log, Grace: time.Second, Rules: s.rules})
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
func (s *stack) runEvents(run string) []event {
	s.t.Helper()
	cons, err := s.bus.Stream.OrderedConsumer(s.ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.SubjectRun(run)}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	var out []event
	for {
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			s.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			e := event{subject: m.Subject(), data: m.Data()}
			e.meta, e.err = events.DecodeMsg(m, nil)
			out = append(out, e)
		}
		if n == 0 {
			return out
		}
	}
}

type event struct {
	subject string
	meta    events.Meta
	data    []byte
	err     error
}

// waitEnd waits for the run's outcome event of one of the given statuses.
func (s *stack) waitEnd(run string, statuses ...toolbus.RunStatus) toolbus.RunEnded {
	s.t.Helper()
	if len(statuses) == 0 {
		statuses = []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled, toolbus.RunWaitingForApproval}
	}
	var ended toolbus.RunEnded
	eventstest.Eventually(s.t, 60*time.Second, func() error {
		for _, st := range statuses {
			raw, err := s.bus.Stream.GetLastMsgForSubject(s.ctx, events.SubjectRunEnded(run, st))
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
	for _, e := range s.runEvents(run) {
		if e.meta.Type != events.TypeToolFinished {
			continue
		}
		var tf toolbus.ToolFinished
		if err := jsonUnmarshal(e.data, &tf); err != nil {
			s.t.Fatal(err)
		}
		out = append(out, tf)
	}
	return out
}

func countType(evs []event, typ string) int {
	n := 0
	for _, e := range evs {
		if e.meta.Type == typ {
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
