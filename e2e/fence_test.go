package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/planner"
)

// Fencing at the join. An executor cut off from the bus (or paused) whose result was
// sent in time but stored late, after another attempt took the call over: the step
// must use the result of the attempt that owns the call, unless that attempt yielded
// to the late result or is gone. The executors are played by the test (the claim, the
// owner's instance record and the results, written as the executors write them), so
// each ordering is exact; the planner and the injector are the real ones.
func TestLateResultOfSupersededAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range lateResultCases("") {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, fenceModel())
			lateResult(t, s, tc)
		})
	}
}

// The injector fences late results with the shipped injector role credentials, not
// admin: it reads the call's claim and its owner's instance record (of a team: the
// record is keyed by the team, store.InstanceKey). A late result of a superseded attempt
// is held back while the owning attempt's executor is alive, and joined once it is
// gone, with no permission violation. For each credential kind of deploy/nats.
func TestRolesInjectorFence(t *testing.T) {
	t.Parallel()
	for _, kind := range credentialKinds() {
		t.Run(kind.name, func(t *testing.T) {
			for _, tc := range lateResultCases("alpha") {
				if !strings.HasPrefix(tc.name, "held back") && !strings.HasPrefix(tc.name, "joined when the later attempt's owner is gone") {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					// A server per case: an owner's record of one case must not be alive in
					// the next.
					url, opts := kind.start(t)
					s := newSecuredStack(t, url, opts, []string{"planner", "injector"}, fenceModel())
					lateResult(t, s, tc)
					if v := s.viol.all(); len(v) > 0 {
						t.Fatalf("permission violations: %v", v)
					}
				})
			}
		})
	}
}

// fencedTool is the tool of the fencing tests: in the catalog, served by no executor
// (the test answers for them).
const fencedTool = "fenced_tool"

func fenceModel() planner.Model {
	return &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("c1", fencedTool, `{}`)),
		planner.Answer("done"),
	}}
}

// lateCase is one ordering of a late result (attempt 1) and the call's claim.
type lateCase struct {
	name string
	// claim is the call's claim when the late result (attempt 1) arrives.
	claim store.Claim
	// ownerAlive keeps the claim's owner's instance record alive.
	ownerAlive bool
	// lateLease is the late result's LeaseUntil.
	lateLease time.Time
	// second publishes the owning attempt's result once the late one is held back.
	second bool
	want   string
}

// lateResultCases are the orderings, with the executors of team (empty: untokened).
func lateResultCases(team string) []lateCase {
	past := time.Now().Add(-time.Hour).UTC()
	future := time.Now().Add(time.Hour).UTC()
	return []lateCase{
		{name: "held back while a later attempt owns the call", claim: store.Claim{Team: team, Instance: "exec-b", Boot: "b2", Attempt: 2},
			ownerAlive: true, lateLease: past, second: true, want: "attempt 2"},
		{name: "joined when the later attempt yielded to it", claim: store.Claim{Team: team, Instance: "exec-b", Boot: "b2", Attempt: 2, Yielded: true},
			ownerAlive: true, lateLease: past, want: "attempt 1"},
		{name: "joined when the later attempt's owner is gone", claim: store.Claim{Team: team, Instance: "exec-b", Boot: "b2", Attempt: 2},
			lateLease: past, want: "attempt 1"},
		{name: "joined when its own attempt still owns the call", claim: store.Claim{Team: team, Instance: "exec-a", Boot: "b1", Attempt: 1},
			lateLease: past, want: "attempt 1"},
		{name: "stored before its lease ran out: joined as it comes", claim: store.Claim{Team: team, Instance: "exec-b", Boot: "b2", Attempt: 2},
			ownerAlive: true, lateLease: future, want: "attempt 1"},
	}
}

// lateResult plays tc on s: the planner and the injector are started on their buses,
// the executors are played with s.bus.
func lateResult(t *testing.T, s *stack, tc lateCase) {
	t.Helper()
	if err := s.bus.Store().PublishTool(s.ctx, toolbus.ToolContract{Name: fencedTool, Description: "fenced",
		InputSchema: json.RawMessage(`{"type":"object"}`)}, false); err != nil {
		t.Fatal(err)
	}
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	run := "fence-" + strings.ReplaceAll(strings.Fields(tc.name)[0], " ", "")
	s.submit(run, toolbus.Limits{})
	eventstest.Eventually(t, 30*time.Second, func() error {
		if countType(s.runEvents(run), events.TypeToolRequested) == 0 {
			return fmt.Errorf("no tool.requested yet")
		}
		return nil
	})
	if _, _, err := s.bus.Store().ClaimCall(s.ctx, fencedTool, run, 0, "c1", tc.claim); err != nil {
		t.Fatal(err)
	}
	if tc.ownerAlive {
		keepAlive(t, s, tc.claim.Team, tc.claim.Instance, tc.claim.Boot)
	}
	publish := func(attempt int, lease time.Time) {
		t.Helper()
		src := events.Source("executor", fmt.Sprintf("exec-%d", attempt))
		if _, err := s.bus.PublishEvent(s.ctx, events.ToolFinishedEvent(src, toolbus.ToolFinished{
			RunID: run, Step: 0, CallIndex: 0, CallCount: 1, ToolResult: toolbus.ToolResult{
				CallID: "c1", Tool: fencedTool, Status: toolbus.StatusSucceeded, Content: fmt.Sprintf("attempt %d", attempt),
				Attempt: attempt, LeaseUntil: &lease, Executor: fmt.Sprintf("exec-%d", attempt)}})); err != nil {
			t.Fatal(err)
		}
	}
	publish(1, tc.lateLease)
	if tc.second {
		// The injector received the late result and handed it back (it is
		// redelivered) without joining it: the model was not asked again.
		eventstest.Eventually(t, 30*time.Second, func() error {
			info, err := s.bus.EventStream().Consumer(s.ctx, events.ConsumerInjector)
			if err != nil {
				return err
			}
			ci, err := info.Info(s.ctx)
			if err != nil {
				return err
			}
			if ci.NumRedelivered == 0 {
				return fmt.Errorf("late result not handed back yet (ack pending %d)", ci.NumAckPending)
			}
			return nil
		})
		if _, ok := s.seenReq.forStep(run, 1); ok {
			t.Fatal("the step was joined with the late result of the superseded attempt")
		}
		publish(2, time.Now().Add(time.Hour).UTC())
	}
	if ended := s.waitEnd(run); ended.Status != toolbus.RunCompleted {
		t.Fatalf("run ended %+v", ended)
	}
	req, ok := s.seenReq.forStep(run, 1)
	if !ok {
		t.Fatal("the model was not asked for step 1")
	}
	last := req.Messages[len(req.Messages)-1]
	if last.Role != toolbus.RoleTool || last.Content != tc.want {
		t.Fatalf("the model read %s %q, want the tool message %q", last.Role, last.Content, tc.want)
	}
	// Both results are in the stream when both were published; the replay
	// reads the later attempt's as the call's, with no violation.
	if n := countType(s.runEvents(run), events.TypeToolFinished); tc.second && n != 2 {
		t.Errorf("%d tool.finished stored, want both attempts' results", n)
	}
	rep := replayOf(t, s.ctx, s.bus, run)
	if len(rep.Violations) != 0 {
		t.Errorf("replay violations: %+v", rep.Violations)
	}
	var read string
	for _, c := range rep.Calls {
		if c.Result != nil {
			read = c.Result.Content
		}
	}
	if read != tc.want {
		t.Errorf("replay reads the call's result %q, want %q", read, tc.want)
	}
}

// keepAlive keeps an executor instance record alive (as its heartbeats would) until
// the end of the test.
func keepAlive(t *testing.T, s *stack, team, name, boot string) {
	t.Helper()
	put := func() error {
		_, err := s.bus.Store().PutInstance(s.ctx, store.Instance{Team: team, Name: name, Boot: boot, HeartbeatAt: time.Now().UTC()})
		return err
	}
	if err := put(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(s.bus.Store().InstanceTTL() / 5)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = put()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// Results of a real executor carry their attempt's fencing deadline, and the stream
// stored them before it: the injector joins them without reading their claim.
func TestResultsCarryTheirLease(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "noop", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	s.startExecutor("executor-1", worker.Config{})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	s.submit("leased", toolbus.Limits{})
	if ended := s.waitEnd("leased"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("run ended %+v", ended)
	}
	n := 0
	s.walk("leased", audit.Visitor{ToolFinished: func(ev runlog.StoredEvent, tf toolbus.ToolFinished) {
		n++
		switch {
		case tf.LeaseUntil == nil:
			t.Errorf("result of %s carries no lease_until", tf.CallID)
		case !ev.Time.Before(*tf.LeaseUntil):
			t.Errorf("result of %s stored at %s, not before its lease_until %s", tf.CallID, ev.Time, tf.LeaseUntil)
		case tf.LeaseUntil.After(ev.Time.Add(s.bus.Store().InstanceTTL())):
			t.Errorf("result of %s: lease_until %s is more than one instance TTL after it was stored (%s)", tf.CallID, tf.LeaseUntil, ev.Time)
		}
	}})
	if n != 2 {
		t.Fatalf("%d results, want 2", n)
	}
}
