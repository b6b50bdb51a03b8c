package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/planner"
)

// deployTool is a tool with a side effect that needs a person's approval; it counts its
// runs per call.
type deployTool struct {
	mu   sync.Mutex
	runs map[string]int // "<step>/<call_id>" -> runs
}

func newDeployTool() *deployTool { return &deployTool{runs: map[string]int{}} }

func (d *deployTool) tool() executor.Tool {
	return executor.Tool{
		Name: "deploy", Description: "deploys a service (needs approval)", NeedsApproval: true,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"service":{"type":"string"}}}`),
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			d.mu.Lock()
			d.runs[ci.IdempotencyKey]++
			d.mu.Unlock()
			var in struct{ Service string }
			_ = json.Unmarshal(args, &in)
			return map[string]string{"deployed": in.Service}, nil
		},
	}
}

// total is the number of times the tool ran.
func (d *deployTool) total() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, v := range d.runs {
		n += v
	}
	return n
}

// decide publishes an approval decision for a call of the run's current step, as
// `toolbus approve` and `toolbus deny` do.
func (s *stack) decide(run, callID string, granted bool, why string) {
	s.t.Helper()
	step, err := s.bus.Store().CurrentStep(s.ctx, run)
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.bus.PublishApproval(s.ctx, events.Source("test", "approver"), step,
		toolbus.Approval{RunID: run, CallID: callID, Who: "alice", Why: why}, granted); err != nil {
		s.t.Fatal(err)
	}
}

// outcomes returns the run.<status> events of a run, in stream order.
func (s *stack) outcomes(run string) []toolbus.RunEnded {
	s.t.Helper()
	var out []toolbus.RunEnded
	s.walk(run, audit.Visitor{RunEnded: func(_ runlog.StoredEvent, re toolbus.RunEnded) { out = append(out, re) }})
	return out
}

// waitOutcome waits until the run's latest outcome satisfies ok.
func (s *stack) waitOutcome(run string, what string, ok func(toolbus.RunEnded) bool) toolbus.RunEnded {
	s.t.Helper()
	var last toolbus.RunEnded
	// Two minutes: on a 2-core machine with two CPU hogs beside the whole suite, a
	// restart of every role once took longer than one (TestApprovalSurvivesRestarts).
	eventstest.Eventually(s.t, 2*time.Minute, func() error {
		outs := s.outcomes(run)
		if len(outs) == 0 {
			return fmt.Errorf("run %s has no outcome yet (want %s)", run, what)
		}
		last = outs[len(outs)-1]
		if !ok(last) {
			return fmt.Errorf("run %s: latest outcome %s %v, want %s", run, last.Status, last.Pending, what)
		}
		return nil
	})
	return last
}

func pendingIDs(calls []toolbus.ToolCall) string {
	ids := make([]string, len(calls))
	for i, c := range calls {
		ids[i] = c.CallID
	}
	return strings.Join(ids, ",")
}

func waitingFor(ids string) func(toolbus.RunEnded) bool {
	return func(re toolbus.RunEnded) bool {
		return re.Status == toolbus.RunWaitingForApproval && pendingIDs(re.Pending) == ids
	}
}

func statusIs(st toolbus.RunStatus) func(toolbus.RunEnded) bool {
	return func(re toolbus.RunEnded) bool { return re.Status == st }
}

// resultOf returns the result of a call of a step.
func (s *stack) resultOf(run string, step int, callID string) (toolbus.ToolResult, bool) {
	for _, tf := range s.finished(run) {
		if tf.Step == step && tf.ToolResult.CallID == callID {
			return tf.ToolResult, true
		}
	}
	return toolbus.ToolResult{}, false
}

// A step that mixes an approval-needing call with ordinary ones: the ordinary calls run,
// the deploy does not; the run waits with the deploy pending; once granted, the deploy
// runs and the model reads all three results in call order.
func TestApprovalGrantedKeepsEveryResult(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "deploy", `{"service":"api"}`), call("c", "calculator", `{"expression":"2*21"}`)),
		planner.Answer("deployed"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	s.submit("approve-1", toolbus.Limits{})

	waiting := s.waitOutcome("approve-1", "waiting for b", waitingFor("b"))
	if waiting.StepsUsed != 1 || waiting.Pending[0].Tool != "deploy" || waiting.Pending[0].Arguments != `{"service":"api"}` {
		t.Fatalf("waiting outcome %+v", waiting)
	}
	if n := deploy.total(); n != 0 {
		t.Fatalf("deploy ran %d times before approval", n)
	}
	st, _, err := s.bus.Store().RunState(s.ctx, "approve-1")
	if err != nil || st.Status != toolbus.RunWaitingForApproval || st.Step != 0 {
		t.Fatalf("run state %+v %v", st, err)
	}
	// The run waits as soon as b does; a and c finish meanwhile or soon after.
	eventstest.Eventually(t, 60*time.Second, func() error {
		evs := s.runEvents("approve-1")
		if countType(evs, events.TypeToolFinished) != 2 || countType(evs, events.TypeToolWaiting) != 1 {
			return fmt.Errorf("%d results and %d waiting before the decision", countType(evs, events.TypeToolFinished), countType(evs, events.TypeToolWaiting))
		}
		return nil
	})

	s.decide("approve-1", "b", true, "change ticket CHG-1")
	ended := s.waitEnd("approve-1", toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled)
	if ended.Status != toolbus.RunCompleted || ended.Answer != "deployed" {
		t.Fatalf("outcome %+v", ended)
	}
	if n := deploy.total(); n != 1 {
		t.Fatalf("deploy ran %d times, want 1", n)
	}
	req, ok := s.seenReq.forStep("approve-1", 1)
	if !ok {
		t.Fatal("no model request for step 1")
	}
	if got, want := toolRoles(req.Messages), "system,user,assistant,tool:a,tool:b,tool:c"; got != want {
		t.Fatalf("history %s, want %s", got, want)
	}
	if b := req.Messages[4]; b.IsError || b.Content != `{"deployed":"api"}` {
		t.Fatalf("deploy result the model read: %+v", b)
	}
	if c := req.Messages[5]; c.IsError || !strings.Contains(c.Content, "42") {
		t.Fatalf("calculator result the model read: %+v", c)
	}
	// Exactly one result per call.
	if got := len(s.finished("approve-1")); got != 3 {
		t.Fatalf("%d results, want 3", got)
	}
}

// A denied call is not run: it comes back to the model as rejected/approval_denied with
// the reason, and the model goes on.
func TestApprovalDenied(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "deploy", `{"service":"db"}`)),
		func(req planner.Request) planner.Response {
			return planner.Answer("not deployed: " + req.Messages[len(req.Messages)-1].Content)(req)
		},
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	s.submit("deny-1", toolbus.Limits{})
	s.waitOutcome("deny-1", "waiting for b", waitingFor("b"))
	s.decide("deny-1", "b", false, "freeze until Monday")
	ended := s.waitEnd("deny-1", toolbus.RunCompleted, toolbus.RunFailed)
	if ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	if n := deploy.total(); n != 0 {
		t.Fatalf("a denied call ran %d times", n)
	}
	res, ok := s.resultOf("deny-1", 0, "b")
	if !ok || res.Status != toolbus.StatusRejected || res.Code() != toolbus.CodeApprovalDenied || !strings.Contains(res.Error.Message, "freeze until Monday") {
		t.Fatalf("result of the denied call: %+v", res)
	}
	req, _ := s.seenReq.forStep("deny-1", 1)
	if got, want := toolRoles(req.Messages), "system,user,assistant,tool:a,tool:b"; got != want {
		t.Fatalf("history %s, want %s", got, want)
	}
	if m := req.Messages[4]; !m.IsError || !strings.Contains(m.Content, "approval_denied") {
		t.Fatalf("the model read %+v", m)
	}
}

// Waiting, deciding and resuming survive restarts of every process: nothing of it lives
// in a process. Two calls wait; each decision comes while a fresh set of workers runs.
func TestApprovalSurvivesRestarts(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "deploy", `{"service":"api"}`), call("c", "deploy", `{"service":"db"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	s.submit("restart-approval", toolbus.Limits{})
	s.waitOutcome("restart-approval", "waiting for b,c", waitingFor("b,c"))

	s.stopAll()
	s.startExecutor("executor-2", worker.Config{})
	s.startPlanner("planner-2")
	s.startInjector("injector-2")
	s.decide("restart-approval", "b", true, "")
	// b runs; the run waits again, for c only.
	s.waitOutcome("restart-approval", "waiting for c", waitingFor("c"))
	if n := deploy.total(); n != 1 {
		t.Fatalf("deploy ran %d times, want 1", n)
	}

	s.stop("injector-2")
	s.stop("executor-2")
	s.decide("restart-approval", "c", false, "one deploy at a time")
	s.startInjector("injector-3")
	s.startExecutor("executor-3", worker.Config{})
	ended := s.waitEnd("restart-approval", toolbus.RunCompleted, toolbus.RunFailed)
	if ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	if n := deploy.total(); n != 1 {
		t.Fatalf("deploy ran %d times, want 1", n)
	}
	req, _ := s.seenReq.forStep("restart-approval", 1)
	if got, want := toolRoles(req.Messages), "system,user,assistant,tool:a,tool:b,tool:c"; got != want {
		t.Fatalf("history %s, want %s", got, want)
	}
	if req.Messages[4].IsError || !req.Messages[5].IsError {
		t.Fatalf("b must have succeeded and c been denied: %+v", req.Messages[4:])
	}
}

// Call ids are unique only within a step: a decision on call_0 at step 0 does not
// approve the call_0 of step 1.
func TestApprovalDoesNotCarryOverReusedCallID(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("call_0", "deploy", `{"service":"api"}`)),
		planner.Calls(call("call_0", "deploy", `{"service":"everything"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	s.submit("reuse-1", toolbus.Limits{})
	s.waitOutcome("reuse-1", "waiting at step 0", waitingFor("call_0"))
	s.decide("reuse-1", "call_0", true, "")
	second := s.waitOutcome("reuse-1", "waiting at step 1", func(re toolbus.RunEnded) bool {
		return re.Status == toolbus.RunWaitingForApproval && re.StepsUsed == 2
	})
	if second.Pending[0].Arguments != `{"service":"everything"}` {
		t.Fatalf("pending %+v", second.Pending)
	}
	if n := deploy.total(); n != 1 {
		t.Fatalf("deploy ran %d times, want 1 (step 1 was approved by the step 0 decision)", n)
	}
	s.decide("reuse-1", "call_0", false, "no")
	if ended := s.waitEnd("reuse-1", toolbus.RunCompleted, toolbus.RunFailed); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	if r, _ := s.resultOf("reuse-1", 1, "call_0"); r.Code() != toolbus.CodeApprovalDenied {
		t.Fatalf("step 1 result %+v", r)
	}
}

// A decision that comes before the call waits is kept: the executor applies it, and the
// call never waits.
func TestApprovalBeforeTheCallWaits(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("b", "deploy", `{"service":"api"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startExecutor("executor-1", worker.Config{})
	s.stop("executor-1") // the catalog is published; no executor takes the call yet
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	s.submit("early-1", toolbus.Limits{})
	eventstest.Eventually(t, 10*time.Second, func() error {
		_, err := s.bus.Store().Assistant(s.ctx, "early-1", 0)
		return err
	})
	s.decide("early-1", "b", true, "pre-approved")
	// The decision is recorded before any executor sees the call.
	eventstest.Eventually(t, 10*time.Second, func() error {
		_, err := s.bus.Store().StepDecision(s.ctx, "early-1", 0, "b")
		return err
	})
	s.startExecutor("executor-2", worker.Config{})
	if ended := s.waitEnd("early-1", toolbus.RunCompleted, toolbus.RunFailed); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	if n := countType(s.runEvents("early-1"), events.TypeToolWaiting); n != 0 {
		t.Fatalf("%d tool.waiting: a decided call must not wait", n)
	}
	if deploy.total() != 1 {
		t.Fatalf("deploy ran %d times", deploy.total())
	}
}

// The executor published tool.waiting, the decision comes, and the injector meets both
// events in either order: the call runs once and the run goes on.
func TestApprovalRacesTheWaitingEvent(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("b", "deploy", `{"service":"api"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startExecutor("executor-1", worker.Config{})
	s.stop("executor-1") // the catalog is published; no executor takes the call yet
	s.startPlanner("planner-1")
	// The injector starts the run (its first run.started), then stops: tool.waiting
	// stays in the stream.
	s.startInjector("injector-1")
	s.submit("race-1", toolbus.Limits{})
	eventstest.Eventually(t, 10*time.Second, func() error {
		if countType(s.runEvents("race-1"), events.TypeToolRequested) != 1 {
			return fmt.Errorf("no tool.requested yet")
		}
		return nil
	})
	s.stop("injector-1")
	s.startExecutor("executor-2", worker.Config{})
	eventstest.Eventually(t, 10*time.Second, func() error {
		if countType(s.runEvents("race-1"), events.TypeToolWaiting) != 1 {
			return fmt.Errorf("no tool.waiting yet")
		}
		return nil
	})
	s.decide("race-1", "b", true, "")
	s.startInjector("injector-1")
	if ended := s.waitEnd("race-1", toolbus.RunCompleted, toolbus.RunFailed); ended.Status != toolbus.RunCompleted {
		t.Fatalf("outcome %+v", ended)
	}
	if deploy.total() != 1 {
		t.Fatalf("deploy ran %d times", deploy.total())
	}
	if got := len(s.finished("race-1")); got != 1 {
		t.Fatalf("%d results", got)
	}
}

// An edit published on the bus (not through the CLI, which checks it first) whose
// arguments the tool's schema refuses is refused by the injector: not recorded, the call
// still waits and nothing runs; a corrected edit (its own event id) then decides the
// call, which runs once with the person's arguments. A response on approval.granted is
// refused the same way.
func TestEditRefusedOnTheBus(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("b", "deploy", `{"service":"api"}`)),
		func(req planner.Request) planner.Response {
			return planner.Answer(req.Messages[len(req.Messages)-1].Content)(req)
		},
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	s.submit("edit-bus", toolbus.Limits{})
	s.waitOutcome("edit-bus", "waiting for b", waitingFor("b"))
	publish := func(a toolbus.Approval, granted bool) {
		t.Helper()
		if _, err := s.bus.PublishApproval(s.ctx, events.Source("test", "approver"), 0, a, granted); err != nil {
			t.Fatal(err)
		}
	}
	publish(toolbus.Approval{RunID: "edit-bus", CallID: "b", Who: "mallory", Arguments: `{"service":42}`}, true)
	publish(toolbus.Approval{RunID: "edit-bus", CallID: "b", Who: "mallory", Response: "granted and answered"}, true)
	// Both refusals are terminated by the injector: wait until its queue has no
	// pending approvals, then check that nothing was recorded.
	eventstest.Eventually(t, 30*time.Second, func() error {
		ci, err := s.bus.EventStream().Consumer(s.ctx, "injector-approvals")
		if err != nil {
			return err
		}
		info, err := ci.Info(s.ctx)
		if err != nil {
			return err
		}
		if info.NumPending > 0 || info.NumAckPending > 0 {
			return fmt.Errorf("injector has %d approvals pending", info.NumPending+uint64(info.NumAckPending))
		}
		return nil
	})
	if d, err := s.bus.Store().StepDecision(s.ctx, "edit-bus", 0, "b"); err == nil {
		t.Fatalf("a refused decision was recorded: %+v", d)
	}
	if n := deploy.total(); n != 0 {
		t.Fatalf("deploy ran %d times after refused decisions", n)
	}
	publish(toolbus.Approval{RunID: "edit-bus", CallID: "b", Who: "erin", Arguments: `{"service":"web"}`}, true)
	ended := s.waitOutcome("edit-bus", "completed", statusIs(toolbus.RunCompleted))
	if ended.Status != toolbus.RunCompleted || !strings.Contains(ended.Answer, `{"deployed":"web"}`) || !strings.Contains(ended.Answer, "a person (erin) edited") {
		t.Fatalf("run ended %+v", ended)
	}
	if n := deploy.total(); n != 1 {
		t.Fatalf("deploy ran %d times, want once", n)
	}
}
