package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/planner"
)

// longTool runs until the test releases it: the long sibling of a call that waits.
type longTool struct {
	release chan struct{}
	running atomic.Int32
	done    atomic.Int32
}

func (h *longTool) tool() executor.Tool {
	return executor.Tool{
		Name: "hold", Description: "runs until released", InputSchema: json.RawMessage(`{"type":"object"}`),
		Timeout: 2 * time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			h.running.Add(1)
			select {
			case <-h.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			h.done.Add(1)
			return "released", nil
		},
	}
}

// TestRunWaitsAsSoonAsACallWaits: a step makes a call that needs approval beside a
// long one. The run is waiting_for_approval (event and run state, which the runs list
// shows) while the long call still runs, not once it is done; a decision made then
// applies at once (the deploy runs while the long call still runs) and once; the run
// completes when the long call is released, with one run.waiting_for_approval event
// for the one pending set. Without the decision before the release, the step settling
// announces the same set again: still one event. Before, the run waited only once the
// long call was done.
func TestRunWaitsAsSoonAsACallWaits(t *testing.T) {
	t.Parallel()
	for _, early := range []bool{true, false} {
		t.Run(fmt.Sprintf("decided early %v", early), func(t *testing.T) {
			deploy := newDeployTool()
			hold := &longTool{release: make(chan struct{})}
			model := &planner.Script{Steps: []func(planner.Request) planner.Response{
				planner.Calls(call("long", "hold", `{}`), call("b", "deploy", `{"service":"api"}`)),
				planner.Answer("deployed"),
			}}
			s := newStack(t, model, deploy.tool(), hold.tool())
			s.startAll()
			const run = "wait-early"
			s.submit(run, toolbus.Limits{})
			waiting := s.waitOutcome(run, "waiting for b", waitingFor("b"))
			if hold.done.Load() != 0 || hold.running.Load() != 1 {
				t.Fatalf("the long call is not running while the run waits (running %d, done %d)", hold.running.Load(), hold.done.Load())
			}
			if waiting.StepsUsed != 1 || waiting.Pending[0].Tool != "deploy" {
				t.Fatalf("waiting outcome %+v", waiting)
			}
			st, _, err := s.bus.Store().RunState(s.ctx, run)
			if err != nil || st.Status != toolbus.RunWaitingForApproval || st.Step != 0 {
				t.Fatalf("run state %+v %v, want waiting_for_approval at step 0", st, err)
			}
			if early {
				s.decide(run, "b", true, "")
				eventstest.Eventually(t, 60*time.Second, func() error {
					if _, ok := s.resultOf(run, 0, "b"); !ok {
						return fmt.Errorf("no result of b yet")
					}
					return nil
				})
				if hold.done.Load() != 0 {
					t.Fatal("the long call ended before the check")
				}
			}
			close(hold.release)
			if !early {
				// The step settles with b pending: the same set, announced once.
				eventstest.Eventually(t, 60*time.Second, func() error {
					if _, ok := s.resultOf(run, 0, "long"); !ok {
						return fmt.Errorf("no result of the long call yet")
					}
					return nil
				})
				s.waitOutcome(run, "still waiting for b", waitingFor("b"))
				s.decide(run, "b", true, "")
			}
			ended := s.waitEnd(run, toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled)
			if ended.Status != toolbus.RunCompleted {
				t.Fatalf("outcome %+v", ended)
			}
			if n := deploy.total(); n != 1 {
				t.Errorf("deploy ran %d times, want 1", n)
			}
			if got := len(s.finished(run)); got != 2 {
				t.Errorf("%d results, want 2", got)
			}
			n := 0
			for _, o := range s.outcomes(run) {
				if o.Status == toolbus.RunWaitingForApproval {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d run.waiting_for_approval events, want 1", n)
			}
		})
	}
}
