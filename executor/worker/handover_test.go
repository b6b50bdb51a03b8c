package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestDeadExecutorsCallHandedOverWithinTheLease: an executor dies mid-call (its
// connection is closed: no more heartbeats, no InProgress, as after kill -9) while the
// executors keep the default AckWait (30 s). Another executor takes the call over and
// finishes it about one instance TTL (1 s here) after the death, long before that ack
// wait: the tool's queue waits workerconfig.QueueAckWait, no longer than the lease. The side
// effect happens once (the dead attempt never reaches it), by attempt 2. Before, the
// queue waited the full 30 s ack wait and the call was not finished within 20 s.
func TestDeadExecutorsCallHandedOverWithinTheLease(t *testing.T) {
	tb := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	cfg := events.Config{Memory: true, InstanceTTL: time.Second}
	bus, _, err := provision.Setup(ctx, tb.Conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var effects, started atomic.Int32
	newExec := func() *executor.Executor {
		reg := executor.NewRegistry()
		if err := reg.Register(executor.Tool{Name: "effect", Description: "a side effect after 300ms, or never on attempt 1",
			InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: time.Minute,
			Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
				ci, _ := executor.CallInfoFrom(ctx)
				started.Add(1)
				if ci.Attempt == 1 {
					<-ctx.Done() // the first attempt hangs until its executor is gone
					return nil, ctx.Err()
				}
				if !ci.LeaseValid() {
					return nil, errors.New("lease lost")
				}
				effects.Add(1)
				return "done", nil
			}}); err != nil {
			t.Fatal(err)
		}
		return testutil.Must(executor.New(reg))
	}
	// startWorker starts an executor on a connection of its own; kill closes that
	// connection and nothing else (the worker stops when the test ends).
	startWorker := func(name string) (kill func()) {
		nc, _ := tb.Connect(t)
		b, err := events.Open(ctx, nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(b, newExec(), worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: name,
			Grace: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-done })
		return nc.Close
	}
	const run = "handover"
	if err := bus.StartRun(ctx, events.Source("test", "t"), toolbus.RunStarted{RunID: run, Model: "m",
		Principal: toolbus.Principal{ID: "p"}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "x"}}}); err != nil {
		t.Fatal(err)
	}
	killA := startWorker("exec-a")
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, err := bus.QueueStream().Consumer(ctx, events.ToolConsumer("effect"))
		return err
	})
	if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("test", toolbus.ToolRequested{RunID: run, Step: 0, CallIndex: 0, CallCount: 1,
		Call: toolbus.ToolCall{CallID: "c1", Tool: "effect", Arguments: `{}`}}, true)); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		c, _, err := bus.Store().CurrentClaim(ctx, "effect", run, 0, "c1")
		if err != nil || c.Instance != "exec-a" || started.Load() == 0 {
			return fmt.Errorf("not running on exec-a yet: %+v, %v", c, err)
		}
		return nil
	})
	startWorker("exec-b")
	// exec-a dies: its connection goes, so does everything it would send.
	killA()
	died := time.Now()
	// Well under the executors' ack wait (30 s): only a queue that waits about one
	// lease redelivers the call in time.
	eventstest.Eventually(t, 20*time.Second, func() error {
		evs, err := runlog.Read(ctx, bus.EventStream(), events.SubjectRun(run))
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if ev.Meta.Type != events.TypeToolFinished {
				continue
			}
			var tf toolbus.ToolFinished
			if err := json.Unmarshal(ev.Data, &tf); err != nil {
				return err
			}
			if tf.Executor != "exec-b" || tf.Attempt != 2 || tf.Status != toolbus.StatusSucceeded {
				return fmt.Errorf("result %+v, want exec-b's attempt 2, succeeded", tf.ToolResult)
			}
			return nil
		}
		return errors.New("no result yet")
	})
	t.Logf("call finished by exec-b %v after exec-a died (instance TTL %v)", time.Since(died).Round(10*time.Millisecond), cfg.InstanceTTL)
	if n := effects.Load(); n != 1 {
		t.Errorf("%d side effects, want 1", n)
	}
}
