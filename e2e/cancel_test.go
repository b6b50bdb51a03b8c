package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/planner"
)

// holdTool blocks until its context ends and reports that it started and why it ended.
func holdTool(started chan<- string, ended chan<- error) executor.Tool {
	return executor.Tool{
		Name: "hold", Description: "waits until cancelled", InputSchema: objectSchema, ReadOnly: true,
		Timeout: 5 * time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			started <- ci.IdempotencyKey
			<-ctx.Done()
			ended <- context.Cause(ctx)
			return nil, ctx.Err()
		},
	}
}

// waitIdle waits until the injector has handled every stored event: after it, whatever
// the injector would publish is in the stream.
func (s *stack) waitIdle(durable string) {
	s.t.Helper()
	eventstest.Eventually(s.t, 30*time.Second, func() error {
		for _, durable := range executorQueues(s, []string{durable}) {
			cons, err := s.bus.DurableHome(durable).Consumer(s.ctx, durable)
			if err != nil {
				return err
			}
			ci, err := cons.Info(s.ctx)
			if err != nil {
				return err
			}
			if ci.NumPending != 0 || ci.NumAckPending != 0 {
				return fmt.Errorf("%s: %d pending, %d unacknowledged", durable, ci.NumPending, ci.NumAckPending)
			}
		}
		return nil
	})
}

// executorQueues replaces the name "executor" with the consumers of every tool queue
// (tool_<name>), which together are what executors consume.
func executorQueues(s *stack, durables []string) []string {
	var out []string
	for _, d := range durables {
		if d != "executor" {
			out = append(out, d)
			continue
		}
		queues, err := s.bus.JetStream().Stream(s.ctx, events.QueueStreamName(s.bus.Config().Stream))
		if err != nil {
			s.t.Fatal(err)
		}
		for name := range queues.ConsumerNames(s.ctx).Name() {
			if events.IsToolConsumer(name) {
				out = append(out, name)
			}
		}
	}
	return out
}

// waitEvents waits until the run has n events of type typ.
func (s *stack) waitEvents(run, typ string, n int) {
	s.t.Helper()
	eventstest.Eventually(s.t, 30*time.Second, func() error {
		if got := countType(s.runEvents(run), typ); got != n {
			return fmt.Errorf("run %s has %d %s, want %d", run, got, typ, n)
		}
		return nil
	})
}

// Cancelling a run cancels its calls in flight on every executor (here a 60 s sleep on
// one deployment and a call that blocks on another), their results are cancelled, the
// run ends cancelled, and nothing moves it back: no next step, even with a late result.
func TestCancelInFlightOnEveryExecutor(t *testing.T) {
	t.Parallel()
	started, ended := make(chan string, 4), make(chan error, 4)
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("s", "sleep", `{"ms":60000}`), call("h", "hold", `{}`)),
		planner.Answer("must not be reached"),
	}}
	s := newStack(t, model, holdTool(started, ended))
	s.startExecutor("exec-sleep", worker.Config{Tools: []string{"sleep"}})
	s.startExecutor("exec-hold", worker.Config{Tools: []string{"hold"}})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	s.submit("cancel-1", toolbus.Limits{})
	select {
	case <-started:
	case <-s.ctx.Done():
		t.Fatal("the hold call never started")
	}
	s.waitEvents("cancel-1", events.TypeToolRequested, 2)

	if _, err := s.bus.PublishCancel(s.ctx, events.Source("test", "operator"), toolbus.Cancel{RunID: "cancel-1", Reason: "wrong incident", Who: "bob"}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		st, _, err := s.bus.Store().RunState(s.ctx, "cancel-1")
		if err != nil {
			return err
		}
		if st.Status != toolbus.RunCancelled {
			return fmt.Errorf("status %s", st.Status)
		}
		return nil
	})
	if cause := <-ended; cause == nil {
		t.Fatal("the hold call's context was not cancelled")
	}
	// Both calls end cancelled, well before the sleep's 60 s or its 30 s timeout.
	eventstest.Eventually(t, 10*time.Second, func() error {
		res := s.finished("cancel-1")
		if len(res) != 2 {
			return fmt.Errorf("%d results", len(res))
		}
		for _, tf := range res {
			if tf.ToolResult.Status != toolbus.StatusCancelled || tf.ToolResult.Code() != toolbus.CodeCancelled {
				return fmt.Errorf("result %s: %s %s", tf.ToolResult.CallID, tf.ToolResult.Status, tf.ToolResult.Code())
			}
		}
		return nil
	})
	byExecutor := map[string]string{}
	for _, tf := range s.finished("cancel-1") {
		byExecutor[tf.ToolResult.Tool] = tf.ToolResult.Executor
	}
	if byExecutor["sleep"] != "exec-sleep" || byExecutor["hold"] != "exec-hold" {
		t.Fatalf("calls ran on %v, want one per executor", byExecutor)
	}

	// A late result (a different event id, so the stream keeps it) changes nothing.
	late := toolbus.ToolFinished{RunID: "cancel-1", Step: 0, CallIndex: 1, CallCount: 2,
		ToolResult: toolbus.ToolResult{CallID: "h", Tool: "hold", Status: toolbus.StatusSucceeded, Content: `"late"`, Executor: "ghost"}}
	if _, err := s.bus.Publish(s.ctx, events.SubjectToolFinished("cancel-1", "hold"), events.Meta{
		ID: "late-result-1", Type: events.TypeToolFinished, Source: "/test", RunID: "cancel-1", CallID: "h", CallIndex: 1, CallCount: 2,
	}, late); err != nil {
		t.Fatal(err)
	}
	s.waitIdle("injector")

	st, _, err := s.bus.Store().RunState(s.ctx, "cancel-1")
	if err != nil || st.Status != toolbus.RunCancelled {
		t.Fatalf("run state %+v %v", st, err)
	}
	outs := s.outcomes("cancel-1")
	if len(outs) != 1 || outs[0].Status != toolbus.RunCancelled || outs[0].Code != toolbus.CodeCancelled ||
		outs[0].Reason != "wrong incident (by bob)" {
		t.Fatalf("outcomes %+v", outs)
	}
	evs := s.runEvents("cancel-1")
	if n := countType(evs, events.TypeModelRequested); n != 1 {
		t.Fatalf("%d model.requested, want only step 0's", n)
	}
	if _, ok := s.seenReq.forStep("cancel-1", 1); ok {
		t.Fatal("the model was asked for step 1 of a cancelled run")
	}
}

// A run that waits for approval can be cancelled; a later approval is ignored.
func TestCancelWhileWaitingForApproval(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("b", "deploy", `{"service":"api"}`)),
		planner.Answer("must not be reached"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	s.submit("cancel-waiting", toolbus.Limits{})
	s.waitOutcome("cancel-waiting", "waiting for b", waitingFor("b"))
	if _, err := s.bus.PublishCancel(s.ctx, "/test", toolbus.Cancel{RunID: "cancel-waiting", Reason: "not needed"}); err != nil {
		t.Fatal(err)
	}
	s.waitOutcome("cancel-waiting", "cancelled", statusIs(toolbus.RunCancelled))
	// The approval comes too late.
	if _, err := s.bus.PublishApproval(s.ctx, "/test", 0, toolbus.Approval{RunID: "cancel-waiting", CallID: "b", Who: "alice"}, true); err != nil {
		t.Fatal(err)
	}
	s.waitIdle("injector")
	s.waitIdle("executor")
	if n := deploy.total(); n != 0 {
		t.Fatalf("deploy ran %d times in a cancelled run", n)
	}
	if _, err := s.bus.Store().StepDecision(s.ctx, "cancel-waiting", 0, "b"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("a decision was recorded for an ended run: %v", err)
	}
	if outs := s.outcomes("cancel-waiting"); outs[len(outs)-1].Status != toolbus.RunCancelled {
		t.Fatalf("outcomes %+v", outs)
	}
}

// Cancelling a run that already ended changes nothing.
func TestCancelEndedRun(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{planner.Answer("42")}}
	s := newStack(t, model)
	s.startAll()
	s.submit("cancel-late", toolbus.Limits{})
	s.waitEnd("cancel-late", toolbus.RunCompleted)
	if _, err := s.bus.PublishCancel(s.ctx, "/test", toolbus.Cancel{RunID: "cancel-late"}); err != nil {
		t.Fatal(err)
	}
	s.waitIdle("injector")
	st, _, err := s.bus.Store().RunState(s.ctx, "cancel-late")
	if err != nil || st.Status != toolbus.RunCompleted {
		t.Fatalf("run state %+v %v", st, err)
	}
	if outs := s.outcomes("cancel-late"); len(outs) != 1 {
		t.Fatalf("outcomes %+v", outs)
	}
}

// A call taken after its run ended is not run: its result is cancelled with code
// run_ended. The executor knows it from the run's outcome event when the run started
// while it listened, and from the run state otherwise (an executor started after the
// run ended); both are checked with a late tool.requested for a completed run.
func TestCallOfEndedRunNotRun(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	counted := executor.Tool{
		Name: "counted", Description: "counts its executions", InputSchema: objectSchema,
		Func: func(context.Context, json.RawMessage) (any, error) { ran.Add(1); return "ran", nil },
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{planner.Answer("done")}}
	s := newStack(t, model, counted)
	late := func(run, executorName string) {
		t.Helper()
		c := call("late", "counted", `{}`)
		if _, err := s.bus.Publish(s.ctx, events.SubjectToolRequested(run, c.Tool), events.Meta{
			ID: events.IDToolRequested(run, 0, c.CallID, false), Type: events.TypeToolRequested, Source: events.Source("planner", "test"),
			RunID: run, Step: 0, CallID: c.CallID, CallIndex: 0, CallCount: 1, HasCall: true,
		}, toolbus.ToolRequested{RunID: run, Step: 0, CallIndex: 0, CallCount: 1, Call: c}); err != nil {
			t.Fatal(err)
		}
		var res []toolbus.ToolFinished
		eventstest.Eventually(t, 30*time.Second, func() error {
			if res = s.finished(run); len(res) != 1 {
				return fmt.Errorf("run %s has %d results", run, len(res))
			}
			return nil
		})
		r := res[0].ToolResult
		if r.Status != toolbus.StatusCancelled || r.Code() != toolbus.CodeRunEnded || r.Executor != executorName {
			t.Errorf("run %s: late call got %s/%s from %q, want cancelled/%s from %s", run, r.Status, r.Code(), r.Executor, toolbus.CodeRunEnded, executorName)
		}
	}
	s.startExecutor("listening", worker.Config{})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")

	// Started while the executor listened: its outcome event says it ended.
	s.submit("ended-heard", toolbus.Limits{})
	s.waitEnd("ended-heard", toolbus.RunCompleted)
	late("ended-heard", "listening")

	// Ended before this executor started: only the run state says so.
	s.submit("ended-before", toolbus.Limits{})
	s.waitEnd("ended-before", toolbus.RunCompleted)
	s.stop("listening")
	s.startExecutor("late-comer", worker.Config{})
	late("ended-before", "late-comer")

	if n := ran.Load(); n != 0 {
		t.Errorf("the tool ran %d times for calls of ended runs", n)
	}
}
