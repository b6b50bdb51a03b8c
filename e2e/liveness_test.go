package e2e_test

// Runs always end (issue 12): bounded step state, deadlines by timer, no lost outcome.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// newStackWith is newStack on a bus set up with cfg (a short duplicate window...).
func newStackWith(t *testing.T, cfg events.Config, model planner.Model, extra ...executor.Tool) *stack {
	t.Helper()
	return newStackOnWith(t, eventstest.RunJetStream(t), cfg, model, extra...)
}

// startInjectorWith starts an injector with cfg (name, logger and grace filled in).
func (s *stack) startInjectorWith(name string, cfg injector.Config) {
	cfg.Instance, cfg.Logger, cfg.Grace = name, s.log, time.Second
	if cfg.Rules.FailOn == nil {
		cfg.Rules = s.rules
	}
	s.start(name, must(injector.New(s.bus, cfg)).Run)
}

// requests returns the model requests of a run, in order.
func (l *requestLog) requests(run string) []planner.Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []planner.Request
	for _, r := range l.reqs {
		if r.RunID == run {
			out = append(out, r)
		}
	}
	return out
}

func manyCalls(n int, tool, args string) []toolbus.ToolCall {
	calls := make([]toolbus.ToolCall, n)
	for i := range calls {
		calls[i] = call(fmt.Sprintf("c%d", i), tool, args)
	}
	return calls
}

// toolMessages counts the tool messages of a request and those whose content has sub.
func toolMessages(req planner.Request, sub string) (all, matching int) {
	for _, m := range req.Messages {
		if m.Role == toolbus.RoleTool {
			all++
			if strings.Contains(m.Content, sub) {
				matching++
			}
		}
	}
	return all, matching
}

// A step of 300 calls: the first 128 run, the other 172 get a rejected too_many_calls
// result from the planner, the model reads 300 answers and the run completes.
func TestManyCallsInOneStepEnd(t *testing.T) {
	// Not parallel: it moves megabytes through the bus and is bound by the CPU, so it
	// gains nothing beside other tests and would stretch it past its deadlines.
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(manyCalls(300, "noop", `{}`)...),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	s.startAll()
	s.submit("many-1", toolbus.Limits{Deadline: time.Now().Add(2 * time.Minute)})
	ended := s.waitEnd("many-1")
	if ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v, want completed", ended)
	}
	results := s.finished("many-1")
	rejected := 0
	for _, tf := range results {
		if tf.ToolResult.Code() == toolbus.CodeTooManyCalls {
			if tf.CallIndex < planner.DefaultMaxCallsPerStep || tf.ToolResult.Status != toolbus.StatusRejected {
				t.Fatalf("call %d rejected as too_many_calls: %+v", tf.CallIndex, tf.ToolResult)
			}
			rejected++
		}
	}
	if len(results) != 300 || rejected != 300-planner.DefaultMaxCallsPerStep {
		t.Fatalf("%d results, %d too_many_calls; want 300 and %d", len(results), rejected, 300-planner.DefaultMaxCallsPerStep)
	}
	req, ok := s.seenReq.forStep("many-1", 1)
	if !ok {
		t.Fatal("no model request for step 1")
	}
	if all, tooMany := toolMessages(req, "at most 128 run per step"); all != 300 || tooMany != 172 {
		t.Fatalf("step 1 history has %d tool messages (%d too_many_calls), want 300 (172)", all, tooMany)
	}
}

// megabyteTool returns a 1 MB output.
func megabyteTool() executor.Tool {
	return executor.Tool{
		Name: "megabyte", Description: "returns 1 MB", InputSchema: objectSchema, ReadOnly: true, Timeout: time.Minute,
		Func: func(context.Context, json.RawMessage) (any, error) {
			return strings.Repeat("x", 1<<20), nil
		},
	}
}

// 80 calls of 1 MB each: the join state stays small (one key per result, bounded
// content), so the run completes.
func TestBigResultsInOneStepEnd(t *testing.T) {
	// Not parallel: it moves megabytes through the bus and is bound by the CPU, so it
	// gains nothing beside other tests and would stretch it past its deadlines.
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(manyCalls(80, "megabyte", `{}`)...),
		planner.Answer("done"),
	}}
	s := newStack(t, model, megabyteTool())
	s.startAll()
	s.submit("big-1", toolbus.Limits{Deadline: time.Now().Add(2 * time.Minute)})
	if ended := s.waitEnd("big-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v, want completed", ended)
	}
	req, ok := s.seenReq.forStep("big-1", 1)
	if !ok {
		t.Fatal("no model request for step 1")
	}
	if all, _ := toolMessages(req, ""); all != 80 {
		t.Fatalf("step 1 history has %d tool messages, want 80", all)
	}
}

// A step that never completes (a call whose executor is gone) ends by the run's
// deadline: limit_reached / deadline, the unanswered call listed, and a timed_out result
// from the injector for it on the stream; the answered call keeps its real result.
func TestDeadlineEndsAStepThatNeverCompletes(t *testing.T) {
	t.Parallel()
	lost := executor.Tool{Name: "lost", Description: "served by an executor that stops", InputSchema: objectSchema, ReadOnly: true,
		Func: func(context.Context, json.RawMessage) (any, error) { return "never", nil }}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("ok", "noop", `{}`), call("gone", "lost", `{}`)),
		planner.Answer("never asked"),
	}}
	s := newStack(t, model, lost)
	s.startExecutor("executor-lost", worker.Config{Tools: []string{"lost"}})
	cat, err := s.bus.Store().WatchCatalog(s.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.stop("executor-lost") // its contract stays in the catalog; nobody answers its calls
	// Its last executor gone, the tool is no longer offered to models.
	eventstest.Eventually(t, 10*time.Second, func() error {
		for _, tc := range cat.Tools(nil) {
			if tc.Name == "lost" {
				return errors.New("lost still offered")
			}
		}
		return nil
	})
	s.startExecutor("executor-1", worker.Config{Tools: []string{"noop"}})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	s.submit("deadline-1", toolbus.Limits{Deadline: time.Now().Add(3 * time.Second)})

	ended := s.waitEnd("deadline-1")
	if ended.Status != toolbus.RunLimitReached || ended.Code != toolbus.LimitDeadline {
		t.Fatalf("outcome %+v, want limit_reached / deadline", ended)
	}
	if pendingIDs(ended.Unanswered) != "gone" {
		t.Fatalf("unanswered %v, want [gone]", ended.Unanswered)
	}
	var gone, okRes *toolbus.ToolFinished
	for _, tf := range s.finished("deadline-1") {
		switch tf.ToolResult.CallID {
		case "gone":
			if gone != nil {
				t.Fatal("two results for the unanswered call")
			}
			gone = &tf
		case "ok":
			okRes = &tf
		}
	}
	if gone == nil || gone.ToolResult.Status != toolbus.StatusTimedOut || gone.ToolResult.Code() != toolbus.CodeTimeout ||
		!strings.Contains(gone.ToolResult.Error.Message, "no executor answered") {
		t.Fatalf("result of the unanswered call: %+v", gone)
	}
	if okRes == nil || okRes.ToolResult.Status != toolbus.StatusSucceeded {
		t.Fatalf("result of the answered call: %+v", okRes)
	}
	if n := len(s.outcomes("deadline-1")); n != 1 {
		t.Fatalf("%d outcome events, want 1", n)
	}
	if _, ok := s.seenReq.forStep("deadline-1", 1); ok {
		t.Fatal("the model was asked for a step after the deadline")
	}
	if req, ok := s.seenReq.forStep("deadline-1", 0); !ok {
		t.Fatal("no model request for step 0")
	} else {
		for _, tc := range req.Tools {
			if tc.Name == "lost" {
				t.Error("the model was offered a tool no live executor serves")
			}
		}
	}
}

// A crash between the write of the terminal run state and the publish of the outcome
// (injected by the BeforeOutcome hook): the redelivered result finds the run ended and
// publishes the stored outcome, which reaches the stream exactly once.
func TestOutcomeRepublishedAfterCrash(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`)),
		planner.Answer("never asked"),
	}}
	s := newStack(t, model)
	s.startExecutor("executor-1", worker.Config{})
	s.startPlanner("planner-1")
	var crashes atomic.Int32
	s.startInjectorWith("injector-1", injector.Config{BeforeOutcome: func(ended toolbus.RunEnded) error {
		if ended.RunID == "crash-1" && crashes.Add(1) == 1 {
			return errors.New("injected crash between the state write and the publish")
		}
		return nil
	}})
	s.submit("crash-1", toolbus.Limits{MaxSteps: 1})
	ended := s.waitEnd("crash-1")
	if ended.Status != toolbus.RunLimitReached || ended.Code != toolbus.LimitMaxSteps {
		t.Fatalf("outcome %+v, want limit_reached / max_steps", ended)
	}
	if crashes.Load() < 1 {
		t.Fatal("the crash was never injected")
	}
	st, _, err := s.bus.Store().RunState(s.ctx, "crash-1")
	if err != nil || st.Ended == nil || st.Ended.Code != toolbus.LimitMaxSteps {
		t.Fatalf("stored outcome %+v, %v", st, err)
	}
	s.waitIdle("injector")
	if n := len(s.outcomes("crash-1")); n != 1 {
		t.Fatalf("%d outcome events, want exactly 1", n)
	}
}

// gateTool blocks each call until release is closed and returns "real <call index>".
func gateTool(release <-chan struct{}) executor.Tool {
	return executor.Tool{
		Name: "gate", Description: "waits for the test", InputSchema: objectSchema, ReadOnly: true, Timeout: 2 * time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return fmt.Sprintf("real %d", ci.CallIndex), nil
		},
	}
}

// publishForged publishes a tool.finished event as a hostile publisher would.
func (s *stack) publishForged(id string, tf toolbus.ToolFinished) {
	s.t.Helper()
	if _, err := s.bus.Publish(s.ctx, events.SubjectToolFinished(tf.RunID, tf.ToolResult.Tool), events.Meta{
		ID: id, Type: events.TypeToolFinished, Source: "/forger", RunID: tf.RunID, Step: tf.Step,
		CallID: tf.ToolResult.CallID, CallIndex: tf.CallIndex, CallCount: tf.CallCount, HasCall: true,
	}, tf); err != nil {
		s.t.Fatal(err)
	}
}

// Forged results that do not match the recorded step (wrong count, wrong call id, wrong
// tool, a duplicate behind the real result) are terminated: the run completes with the
// real results.
func TestForgedResultsCannotReplaceOrWedgeAStep(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "gate", `{}`), call("b", "gate", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, gateTool(release))
	s.startAll()
	s.submit("forged-1", toolbus.Limits{Deadline: time.Now().Add(2 * time.Minute)})
	s.waitEvents("forged-1", events.TypeToolRequested, 2)

	forged := func(idx, count int, callID, tool string) toolbus.ToolFinished {
		return toolbus.ToolFinished{RunID: "forged-1", Step: 0, CallIndex: idx, CallCount: count,
			ToolResult: toolbus.ToolResult{CallID: callID, Tool: tool, Status: toolbus.StatusSucceeded, Content: "forged"}}
	}
	s.publishForged("f-count", forged(0, 3, "a", "gate"))    // wrong count
	s.publishForged("f-callid", forged(1, 2, "zzz", "gate")) // wrong call id
	s.publishForged("f-tool", forged(1, 2, "b", "noop"))     // wrong tool
	s.waitIdle("injector")
	if st, _, err := s.bus.Store().StepState(s.ctx, "forged-1", 0); err == nil && st.Received.Count() != 0 {
		t.Fatalf("forged results joined: %+v", st)
	}

	close(release)
	// The real result of a is joined; a forged duplicate behind it is terminated.
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, err := s.bus.Store().Result(s.ctx, "forged-1", 0, 0)
		return err
	})
	s.publishForged("f-dup", forged(0, 2, "a", "gate"))

	if ended := s.waitEnd("forged-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v, want completed", ended)
	}
	req, ok := s.seenReq.forStep("forged-1", 1)
	if !ok {
		t.Fatal("no model request for step 1")
	}
	if all, real := toolMessages(req, "real "); all != 2 || real != 2 {
		t.Fatalf("step 1 history: %d tool messages, %d real; want 2 real: %+v", all, real, req.Messages)
	}
	s.waitIdle("injector")
	if r, err := s.bus.Store().Result(s.ctx, "forged-1", 0, 0); err != nil || !strings.Contains(r.Content, "real") {
		t.Fatalf("joined result of a: %+v %v", r, err)
	}
}

// counterTool counts its runs.
func counterTool(n *atomic.Int32) executor.Tool {
	return executor.Tool{Name: "count_runs", Description: "counts", InputSchema: objectSchema,
		Func: func(context.Context, json.RawMessage) (any, error) { return n.Add(1), nil }}
}

// A run id names one run forever: after the duplicate window, StartRun refuses it
// (ErrRunExists), and a second run.started published directly is terminated by the
// injector and changes nothing: no tool runs again, the model is not asked again.
func TestRunIDIsNeverReused(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "count_runs", `{}`)),
		planner.Answer("done"),
	}}
	s := newStackWith(t, events.Config{Duplicates: time.Second}, model, counterTool(&runs))
	s.startAll()
	s.submit("once-1", toolbus.Limits{})
	if ended := s.waitEnd("once-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	firstSeq, err := s.bus.RunStartedSeq(s.ctx, "once-1")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // let the 1s duplicate window pass: the point of the test

	err = s.bus.StartRun(s.ctx, "/test", toolbus.RunStarted{RunID: "once-1",
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "again"}}})
	if !errors.Is(err, events.ErrRunExists) {
		t.Fatalf("StartRun of an existing id: %v, want ErrRunExists", err)
	}
	// The same event published directly, with the original id (outside the window) and
	// with a new one: both are stored, and both are terminated.
	for _, id := range []string{events.IDRunStarted("once-1"), "forged/run.started"} {
		ack, err := s.bus.Publish(s.ctx, events.SubjectRunStarted("once-1", ""), events.Meta{
			ID: id, Type: events.TypeRunStarted, Source: "/forger", RunID: "once-1",
		}, toolbus.RunStarted{RunID: "once-1", AllowedTools: []string{"noop"},
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "again"}}})
		if err != nil || ack.Duplicate {
			t.Fatalf("direct publish %s: %+v %v", id, ack, err)
		}
	}
	// And one carrying a condition the stream checked, over its own subject only (empty
	// before it): it says nothing of the run, and is terminated too.
	forged := events.RunStartedEvent("/forger", toolbus.RunStarted{RunID: "once-1", Principal: toolbus.Principal{ID: "forger"}})
	msg, err := events.Encode(forged.Subject, forged.Meta, forged.Data)
	if err != nil {
		t.Fatal(err)
	}
	msg.Header.Set("Nats-Expected-Last-Subject-Sequence", "0")
	msg.Header.Set("Nats-Expected-Last-Subject-Sequence-Subject", forged.Subject)
	if _, err := s.bus.JetStream().PublishMsg(s.ctx, msg, jetstream.WithMsgID("forged/conditional")); err != nil {
		t.Fatalf("direct conditional publish: %v", err)
	}
	s.waitIdle("injector-started")
	s.waitIdle("planner")
	s.waitIdle("injector")
	if n := runs.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want 1", n)
	}
	if n := len(s.seenReq.requests("once-1")); n != 2 {
		t.Fatalf("%d model requests, want 2", n)
	}
	if seq, err := s.bus.RunStartedSeq(s.ctx, "once-1"); err != nil || seq != firstSeq {
		t.Fatalf("first run.started at %d (%v), want %d", seq, err, firstSeq)
	}
	if st, _, err := s.bus.Store().RunState(s.ctx, "once-1"); err != nil || st.Status != toolbus.RunCompleted {
		t.Fatalf("run state %+v %v", st, err)
	}
	if n := countType(s.runEvents("once-1"), events.TypeModelRequested); n != 2 {
		t.Fatalf("%d model.requested, want 2", n)
	}
}

// A forged model.requested for a step that is not the run's current one, or for an
// ended run, calls no model.
func TestForgedModelRequestCallsNoModel(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "gate", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, gateTool(release))
	s.startAll()
	s.submit("mr-1", toolbus.Limits{Deadline: time.Now().Add(2 * time.Minute)})
	s.waitEvents("mr-1", events.TypeToolRequested, 1)

	forge := func(id string, step int) {
		t.Helper()
		if _, err := s.bus.Publish(s.ctx, events.SubjectModelRequested("mr-1"), events.Meta{
			ID: id, Type: events.TypeModelRequested, Source: "/forger", RunID: "mr-1", Step: step,
		}, toolbus.ModelRequested{RunID: "mr-1", Step: step}); err != nil {
			t.Fatal(err)
		}
	}
	forge("forged-1", 1) // step 0 is not complete
	forge("forged-5", 5)
	forge("forged-0", 0) // a duplicate of the current step: answered from the record
	s.waitIdle("planner")
	if n := len(s.seenReq.requests("mr-1")); n != 1 {
		t.Fatalf("%d model requests while step 0 runs, want 1", n)
	}
	close(release)
	if ended := s.waitEnd("mr-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	forge("forged-2", 2) // the run ended
	s.waitIdle("planner")
	reqs := s.seenReq.requests("mr-1")
	if len(reqs) != 2 || reqs[0].Step != 0 || reqs[1].Step != 1 {
		t.Fatalf("model requests %d, want steps 0 and 1 once each", len(reqs))
	}
}

// A decision for call_X at step 0, repeated late, cannot approve the call_X that a
// later step reuses: the run keeps waiting at step 1 until step 1's own decision.
func TestApprovalBoundToItsStep(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("call_X", "deploy", `{"service":"api"}`)),
		planner.Calls(call("call_X", "deploy", `{"service":"db"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	s.submit("bound-1", toolbus.Limits{Deadline: time.Now().Add(2 * time.Minute)})
	s.waitOutcome("bound-1", "waiting for call_X", waitingFor("call_X"))
	s.decide("bound-1", "call_X", true, "step 0")
	eventstest.Eventually(t, 30*time.Second, func() error {
		if _, err := s.bus.Store().Assistant(s.ctx, "bound-1", 1); err != nil {
			return err
		}
		if n := len(s.outcomes("bound-1")); n < 2 {
			return fmt.Errorf("%d outcomes, want the second wait", n)
		}
		return nil
	})
	s.waitOutcome("bound-1", "waiting for call_X at step 1", func(re toolbus.RunEnded) bool {
		return waitingFor("call_X")(re) && re.StepsUsed == 2
	})
	// The step-0 decision again, as a new event (a late or repeated decision).
	if _, err := s.bus.Publish(s.ctx, events.SubjectApproval("bound-1", true, "mallory"), events.Meta{
		ID: "late-decision", Type: events.TypeApprovalGranted, Source: "/late", RunID: "bound-1", Step: 0,
		CallID: "call_X", HasCall: true,
	}, toolbus.Approval{RunID: "bound-1", CallID: "call_X", Who: "mallory"}); err != nil {
		t.Fatal(err)
	}
	s.waitIdle("injector-approvals")
	s.waitIdle("injector")
	if _, err := s.bus.Store().StepDecision(s.ctx, "bound-1", 1, "call_X"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("step 1 decision: %v, want none", err)
	}
	if n := deploy.total(); n != 1 {
		t.Fatalf("deploy ran %d times before step 1 was decided, want 1", n)
	}
	if st, _, err := s.bus.Store().RunState(s.ctx, "bound-1"); err != nil || st.Status != toolbus.RunWaitingForApproval {
		t.Fatalf("run state %+v %v, want waiting_for_approval", st, err)
	}
	s.decide("bound-1", "call_X", true, "step 1")
	if ended := s.waitEnd("bound-1", toolbus.RunCompleted, toolbus.RunFailed); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	if n := deploy.total(); n != 2 {
		t.Fatalf("deploy ran %d times, want 2", n)
	}
}

// A panic in the injector's handler is recovered: the message is terminated with the
// reason, the queue goes on (a later run completes), and the run whose outcome the panic
// interrupted still gets it on the stream, once, from its deadline timer.
func TestInjectorPanicDoesNotBlockOrLoseARun(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`)),
		planner.Answer("never asked"),
	}}
	s := newStack(t, model)
	s.startExecutor("executor-1", worker.Config{})
	s.startPlanner("planner-1")
	var panics atomic.Int32
	s.startInjectorWith("injector-1", injector.Config{BeforeOutcome: func(ended toolbus.RunEnded) error {
		if ended.RunID == "panic-1" && panics.Add(1) == 1 {
			panic("injected panic between the state write and the publish")
		}
		return nil
	}})
	s.submit("panic-1", toolbus.Limits{MaxSteps: 1, Deadline: time.Now().Add(8 * time.Second)})
	eventstest.Eventually(t, 30*time.Second, func() error {
		if panics.Load() == 0 {
			return errors.New("no panic yet")
		}
		return nil
	})
	s.submit("panic-2", toolbus.Limits{MaxSteps: 1})
	if ended := s.waitEnd("panic-2"); ended.Status != toolbus.RunLimitReached {
		t.Fatalf("run after the panic: %+v", ended)
	}
	ended := s.waitEnd("panic-1")
	if ended.Status != toolbus.RunLimitReached || ended.Code != toolbus.LimitMaxSteps {
		t.Fatalf("outcome %+v, want the recorded limit_reached / max_steps", ended)
	}
	s.waitIdle("injector-timers")
	if n := len(s.outcomes("panic-1")); n != 1 {
		t.Fatalf("%d outcome events, want 1", n)
	}
}

// A store that keeps failing does not loop forever: on the last of the injector's
// bounded deliveries the run ends failed with code store_error.
func TestPersistentStoreFailureEndsTheRun(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "gate", `{}`)),
		planner.Answer("never asked"),
	}}
	s := newStack(t, model, gateTool(release))
	s.startExecutor("executor-1", worker.Config{})
	s.startPlanner("planner-1")
	s.startInjectorWith("injector-1", injector.Config{WorkerConfig: workerconfig.WorkerConfig{MaxDeliver: 3}})
	s.submit("store-1", toolbus.Limits{Deadline: time.Now().Add(2 * time.Minute)})
	s.waitEvents("store-1", events.TypeToolRequested, 1)
	// From now on the history bucket refuses every write: results cannot be joined.
	hist, err := s.bus.JetStream().Stream(s.ctx, "KV_"+store.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	cfg := hist.CachedInfo().Config
	cfg.MaxMsgSize = 8
	if _, err := s.bus.JetStream().UpdateStream(s.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	close(release)
	ended := s.waitEnd("store-1")
	if ended.Status != toolbus.RunFailed || ended.Code != toolbus.CodeStoreError {
		t.Fatalf("outcome %+v, want failed / store_error", ended)
	}
	s.waitIdle("injector")
}

// An end recorded in the run state whose outcome event a crash lost (the state is
// written here directly, as by an ender that crashed before publishing): the step the
// injector then asks for (its outcome events do not know the end) calls no model. The
// planner knows the end from the run state's write, which it follows with its outcome
// events instead of reading the run state at every step; it then publishes the lost
// outcome.
func TestEndRecordedButNotPublishedPlansNoStep(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	model := planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		if req.Step > 0 {
			return planner.Answer("done")(req), nil
		}
		if req.RunID == "warm-1" {
			return planner.Calls(call("n", "noop", `{}`))(req), nil
		}
		return planner.Calls(call("a", "gate", `{}`))(req), nil
	})
	s := newStack(t, model, gateTool(release))
	s.startAll()
	// The workers trust their followed ends for the runs that start after the first
	// lookup (on an empty stream they trust nothing): one run first.
	s.submit("warm-1", toolbus.Limits{})
	if ended := s.waitEnd("warm-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("warm-up run: %+v", ended)
	}
	s.submit("lost-end-1", toolbus.Limits{Deadline: time.Now().Add(2 * time.Minute)})
	s.waitEvents("lost-end-1", events.TypeToolRequested, 1)
	if _, err := s.bus.Store().RecordEnd(s.ctx, 0, toolbus.RunEnded{RunID: "lost-end-1", Status: toolbus.RunFailed,
		Code: toolbus.CodeStoreError, Reason: "ended by a worker that crashed before publishing", StepsUsed: 1}); err != nil {
		t.Fatal(err)
	}
	close(release)
	ended := s.waitEnd("lost-end-1")
	if ended.Status != toolbus.RunFailed || ended.Code != toolbus.CodeStoreError {
		t.Fatalf("outcome %+v, want the recorded failed / store_error", ended)
	}
	s.waitIdle("planner")
	if reqs := s.seenReq.requests("lost-end-1"); len(reqs) != 1 || reqs[0].Step != 0 {
		t.Fatalf("%d model requests, want step 0's only", len(reqs))
	}
	// The injector did ask for step 1 (its outcome events did not know the end): the
	// planner is what refused it.
	if n := countType(s.runEvents("lost-end-1"), events.TypeModelRequested); n != 2 {
		t.Fatalf("%d model.requested events, want 2 (steps 0 and 1)", n)
	}
	if n := len(s.outcomes("lost-end-1")); n != 1 {
		t.Fatalf("%d outcome events, want exactly 1", n)
	}
}
