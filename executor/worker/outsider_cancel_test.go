package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// holdCalls is a tool whose calls run until released (by their "key" argument) or
// cancelled, and tell when each started and when its context ended.
type holdCalls struct {
	mu                      sync.Mutex
	started, done, released map[string]chan struct{}
}

func (h *holdCalls) ch(m map[string]chan struct{}, key string) chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m[key] == nil {
		m[key] = make(chan struct{})
	}
	return m[key]
}

func (h *holdCalls) tool() executor.Tool {
	h.started, h.done, h.released = map[string]chan struct{}{}, map[string]chan struct{}{}, map[string]chan struct{}{}
	return executor.Tool{Name: "hold", Description: "holds until released", InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 2 * time.Minute,
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			var in struct{ Key string }
			_ = json.Unmarshal(args, &in)
			close(h.ch(h.started, in.Key))
			select {
			case <-ctx.Done():
				close(h.ch(h.done, in.Key))
				return nil, ctx.Err()
			case <-h.ch(h.released, in.Key):
				return map[string]string{"held": in.Key}, nil
			}
		}}
}

// TestOutsiderCancelLeavesAnothersCall: an outsider holding only client bob's own
// credentials (his account, bound to bob) who learned the id of alice's run writes, on
// his own subject through the write service, a cancel of it. The injector refuses it
// (the decision policy names alice, and ops in TOOLBUS_DECIDERS) and the run goes on;
// so must alice's call in flight on the core's executor, which heard bob's run.cancel
// too (it cancelled the call at once, and every later call of the run, and the run went
// on with a cancelled result), and the planner, which skipped the run's next step (the
// run stalled until its deadline). CONTROL: alice's own cancel of her other run,
// written after bob's (so the executor has handled bob's first), cancels that run's
// call and the run; ops's cancel of a third run, accepted by the injector though the
// run does not name ops, ends its call in flight once the run ended; and alice's first
// call, released, succeeds and her run completes.
func TestOutsiderCancelLeavesAnothersCall(t *testing.T) {
	srv := intaketest.StartTenants(t, nil, map[string][]string{"alice": {"alice"}, "bob": {"bob"}, "ops": {"ops"}})
	connect := func(user string) *nats.Conn { return eventstest.Connect(t, srv, user) }
	// After its pre-planned call, a run's model answers.
	answers := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		return planner.Response{Message: toolbus.Message{Content: "done"}}, nil
	})
	h := &holdCalls{}
	p := testpipe.StartOnWith(t, connect("core"), 2*time.Minute, answers, testpipe.Options{Deciders: []string{"ops"}}, h.tool())
	p.Roles.Go("reads", reads.New(p.Bus, p.Log).Serve)
	client := func(id string) *events.Bus {
		var bus *events.Bus
		nc := connect(id)
		eventstest.Eventually(t, 30*time.Second, func() error {
			var err error
			bus, err = events.Open(p.Ctx, nc, events.Config{ReadPrefix: events.ReadAPIPrefix(id)})
			return err
		})
		return bus
	}
	alice, bob, ops := client("alice"), client("bob"), client("ops")
	tc, err := p.Bus.Store().Contract(p.Ctx, "hold")
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"cx-victim", "cx-sentinel", "cx-ops"} {
		rs := callrun.Build(callrun.Spec{RunID: run, Principal: toolbus.Principal{ID: "alice"}, Tool: tc, Arguments: `{"key":"` + run + `"}`, Via: "test"}, time.Now())
		if err := alice.StartRun(p.Ctx, "/test", rs); err != nil {
			t.Fatal(err)
		}
		select {
		case <-h.ch(h.started, run):
		case <-p.Ctx.Done():
			t.Fatalf("%s's call never started", run)
		}
	}
	if _, err := bob.PublishCancel(p.Ctx, "/outsider", toolbus.Cancel{RunID: "cx-victim", Who: "bob", Reason: "mine now"}); err != nil {
		t.Fatalf("bob's write on his own subject: %v (the probe needs it stored)", err)
	}
	if _, err := alice.PublishCancel(p.Ctx, "/test", toolbus.Cancel{RunID: "cx-sentinel", Who: "alice", Reason: "done with it"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.ch(h.done, "cx-sentinel"):
	case <-p.Ctx.Done():
		t.Fatal("CONTROL: alice's cancel never reached her call")
	}
	p.WaitStatus("cx-sentinel", toolbus.RunCancelled)
	// CONTROL: a decider the run does not name but the injector's policy does (ops, in
	// TOOLBUS_DECIDERS) cancels; the run's end reaches the call in flight.
	if _, err := ops.PublishCancel(p.Ctx, "/test", toolbus.Cancel{RunID: "cx-ops", Who: "ops", Reason: "incident"}); err != nil {
		t.Fatal(err)
	}
	p.WaitStatus("cx-ops", toolbus.RunCancelled)
	select {
	case <-h.ch(h.done, "cx-ops"):
	case <-p.Ctx.Done():
		t.Fatal("CONTROL: ops's accepted cancel never reached the call")
	}
	select {
	case <-h.ch(h.done, "cx-victim"):
		t.Fatal("bob's refused cancel cancelled alice's call in flight")
	default:
	}
	close(h.ch(h.released, "cx-victim"))
	eventstest.Eventually(t, time.Minute, func() error {
		evs, err := runlog.Events(p.Ctx, p.Bus, "cx-victim")
		if err != nil {
			return err
		}
		for _, ev := range evs {
			var tf toolbus.ToolFinished
			if ev.Meta.Type == events.TypeToolFinished && ev.Decode(&tf) == nil {
				if tf.Status != toolbus.StatusSucceeded {
					t.Fatalf("alice's call ended %s: %+v", tf.Status, tf.Error)
				}
				return nil
			}
		}
		return fmt.Errorf("alice's call has no result yet")
	})
	// The planner heard bob's cancel too: it skipped the run's next step, and the run
	// stalled until its deadline.
	p.WaitStatus("cx-victim", toolbus.RunCompleted)
}
