package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestLivenessOfARunningCall counts what keeps a running call alive: the InProgress
// acknowledgements of the call (one every third of its queue's AckWait, which is the
// instance TTL here, whatever the executors' 30 s AckWait) and the instance record's
// renewals (one every fifth of the TTL, per process). It fails when a live call sends
// no InProgress at all over four of its queue's AckWait (the server would redeliver it
// to another executor) or more than its period allows; it logs the rates
// (docs/guarantees.md, "Liveness of a running call").
func TestLivenessOfARunningCall(t *testing.T) {
	tb := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	const ttl = 1500 * time.Millisecond
	cfg := events.Config{Memory: true, InstanceTTL: ttl}
	bus, _, err := provision.Setup(ctx, tb.Conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "long", Description: "runs until released",
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			select {
			case <-release:
				return "done", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}}); err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(bus, testutil.Must(executor.New(reg)), worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "exec-a",
		Grace: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	const run = "liveness"
	if err := bus.StartRun(ctx, events.Source("test", "t"), toolbus.RunStarted{RunID: run, Model: "m",
		Principal: toolbus.Principal{ID: "p"}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "x"}}}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, err := bus.QueueStream().Consumer(ctx, events.ToolConsumer("long"))
		return err
	})
	cons, err := bus.QueueStream().Consumer(ctx, events.ToolConsumer("long"))
	if err != nil {
		t.Fatal(err)
	}
	ackWait := cons.CachedInfo().Config.AckWait
	if want := workerconfig.QueueAckWait(0, ttl); ackWait != want {
		t.Fatalf("queue AckWait %v, want %v (QueueAckWait of the default AckWait and the TTL)", ackWait, want)
	}
	nc, _ := tb.Connect(t)
	progress, err := nc.SubscribeSync("$JS.ACK.>")
	if err != nil {
		t.Fatal(err)
	}
	renewals := eventstest.Counter(t, nc, "$KV.toolbus_instances.>")
	if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("test", toolbus.ToolRequested{RunID: run, Step: 0, CallIndex: 0, CallCount: 1,
		Call: toolbus.ToolCall{CallID: "c1", Tool: "long", Arguments: `{}`}}, true)); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, _, err := bus.Store().CurrentClaim(ctx, "long", run, 0, "c1")
		return err
	})
	start, renewed0 := time.Now(), renewals()
	inProgress, gaps := 0, time.Duration(0)
	last := start
	for time.Since(start) < 4*ackWait {
		m, err := progress.NextMsg(100 * time.Millisecond)
		if errors.Is(err, nats.ErrTimeout) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Data) == "+WPI" {
			inProgress++
			gaps = max(gaps, time.Since(last))
			last = time.Now()
		}
	}
	elapsed := time.Since(start)
	gaps = max(gaps, time.Since(last))
	renewed := renewals() - renewed0
	close(release)
	period := ackWait / 3
	if inProgress == 0 || inProgress > int(elapsed/period)+2 {
		t.Errorf("%d InProgress in %v, want about one per %v", inProgress, elapsed.Round(time.Millisecond), period)
	}
	t.Log(fmt.Sprintf("TTL %v, queue AckWait %v: %.2f InProgress/s for the call (longest gap %v), %.2f instance renewals/s for the process (%d and %d in %v)",
		ttl, ackWait, float64(inProgress)/elapsed.Seconds(), gaps.Round(time.Millisecond), float64(renewed)/elapsed.Seconds(), inProgress, renewed, elapsed.Round(time.Millisecond)))
}
