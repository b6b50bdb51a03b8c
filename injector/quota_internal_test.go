package injector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// TestQuotaStartsPerSecond: a principal's starts beyond its rate (one per 100 s here, in
// bursts of one) are refused with a reason naming the bound; another principal's start
// is admitted meanwhile; a redelivered run.started of an admitted run is admitted again
// (it counts once); a negative bound is refused by Validate.
func TestQuotaStartsPerSecond(t *testing.T) {
	a := newAdmission(Quota{StartsPerSecond: 0.01, MaxRunsInFlight: 5})
	never := func(context.Context, string) (bool, error) { return false, nil }
	start := func(run, who string) string {
		t.Helper()
		why, err := a.admit(context.Background(), toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: who}}, never)
		if err != nil {
			t.Fatal(err)
		}
		return why
	}
	for _, c := range []struct {
		run, who, refused string
	}{
		{"m-1", "mallory", ""},
		{"m-1", "mallory", ""}, // redelivered
		{"m-2", "mallory", "principal mallory starts more than 0.01 runs per second (TOOLBUS_STARTS_PER_SECOND)"},
		{"a-1", "alice", ""},
		{"n-1", "", ""},
		{"n-2", "", "principal (none) starts more than"},
	} {
		why := start(c.run, c.who)
		if c.refused == "" && why != "" || c.refused != "" && !strings.Contains(why, c.refused) {
			t.Errorf("start %s of %q: refused %q, want %q", c.run, c.who, why, c.refused)
		}
	}
	for _, q := range []Quota{{MaxRunsInFlight: -1}, {StartsPerSecond: -1}, {MaxStartBytes: -1}} {
		if (Config{Quota: q}).Validate() == nil {
			t.Errorf("quota %+v accepted", q)
		}
	}
}

// TestFullStreamRefusesNewRuns: with TOOLBUS_STREAM_MAX_BYTES set, the event stream is
// bounded and discards nothing; once it holds StreamAdmitPercent of its bound, a new run
// ends failed quota_exceeded with a reason naming the bound, while a run in flight still
// moves (its cancel is applied and recorded); a start into the full stream is refused
// with ErrStreamFull, never a timeout.
func TestFullStreamRefusesNewRuns(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	const bound = 512 << 10
	bus := eventstest.Setup(t, events.Config{Memory: true, StreamMaxBytes: bound})
	if c := bus.EventStream().CachedInfo().Config; c.MaxBytes != bound || c.Discard != jetstream.DiscardNew {
		t.Fatalf("event stream: max bytes %d, discard %v: want %d, discard new", c.MaxBytes, c.Discard, bound)
	}
	in, err := New(bus, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "full", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	in.room.every = 0 // read the stream's fill at every start
	runInjector(t, ctx, in)
	status := func(run string) (toolbus.RunStatus, *toolbus.RunEnded) {
		st, _, err := bus.Store().RunState(ctx, run)
		if err != nil {
			return "", nil
		}
		return st.Status, st.Ended
	}
	waitStatus := func(run string, want toolbus.RunStatus) *toolbus.RunEnded {
		t.Helper()
		var ended *toolbus.RunEnded
		eventstest.Eventually(t, time.Minute, func() error {
			var got toolbus.RunStatus
			if got, ended = status(run); got != want {
				return fmt.Errorf("run %s is %q, want %s", run, got, want)
			}
			return nil
		})
		return ended
	}
	start := func(run, who string, size int) error {
		return bus.StartRun(ctx, events.Source("test", "t"), toolbus.RunStarted{RunID: run, Model: "m",
			Principal: toolbus.Principal{ID: who}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: strings.Repeat("x", size)}}})
	}
	if err := start("in-flight", "alice", 10); err != nil {
		t.Fatal(err)
	}
	waitStatus("in-flight", toolbus.RunRunning)
	for i := 0; ; i++ {
		info, err := bus.EventStream().Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Bytes*100 >= bound*events.StreamAdmitPercent {
			break
		}
		if err := start(fmt.Sprintf("junk-%d", i), "mallory", 32<<10); err != nil {
			t.Fatalf("junk %d at %d bytes: %v", i, info.State.Bytes, err)
		}
	}
	if err := start("late", "alice", 10); err != nil {
		t.Fatal(err)
	}
	if e := waitStatus("late", toolbus.RunFailed); e.Code != toolbus.CodeQuotaExceeded || !strings.Contains(e.Reason, "TOOLBUS_STREAM_MAX_BYTES") {
		t.Fatalf("late run ended %+v, want quota_exceeded naming the bound", e)
	}
	if _, err := bus.PublishCancel(ctx, events.Source("test", "t"), toolbus.Cancel{RunID: "in-flight", Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	waitStatus("in-flight", toolbus.RunCancelled)
	var full error
	for i := 0; full == nil && i < 100; i++ {
		full = start(fmt.Sprintf("fill-%d", i), "mallory", 32<<10)
	}
	if !errors.Is(full, events.ErrStreamFull) || !strings.Contains(full.Error(), "TOOLBUS_STREAM_MAX_BYTES") {
		t.Fatalf("a start into the full stream: %v, want ErrStreamFull naming the bound", full)
	}
}

// TestDecisionsAreBounded: a decision over events.MaxDecisionBytes is refused by the
// publisher, naming the bound, and terminated unapplied by the injector (decisionSize);
// one within it passes both.
func TestDecisionsAreBounded(t *testing.T) {
	big := strings.Repeat("x", events.MaxDecisionBytes)
	for _, c := range []struct {
		name string
		d    any
		ok   bool
	}{
		{"approval", &toolbus.Approval{RunID: "r", CallID: "c", Who: "alice", Why: "fine"}, true},
		{"answer too large", &toolbus.Approval{RunID: "r", CallID: "c", Who: "alice", Response: big}, false},
		{"cancel", &toolbus.Cancel{RunID: "r", Reason: "stop"}, true},
		{"cancel reason too large", &toolbus.Cancel{RunID: "r", Reason: big}, false},
	} {
		err := decisionSize(c.d)
		if c.ok != (err == nil) || !c.ok && (!errors.Is(err, events.ErrPoison) || !strings.Contains(err.Error(), "events.MaxDecisionBytes")) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	bus := eventstest.Setup(t, events.Config{Memory: true})
	ctx := eventstest.Context(t, time.Minute)
	if _, err := bus.PublishApproval(ctx, "/test", 0, toolbus.Approval{RunID: "r", CallID: "c", Who: "alice", Why: big}, true); err == nil ||
		!strings.Contains(err.Error(), "over the bound") {
		t.Fatalf("a too large approval published: %v", err)
	}
	if _, err := bus.PublishCancel(ctx, "/test", toolbus.Cancel{RunID: "r", Who: "alice", Reason: big}); err == nil {
		t.Fatal("a too large cancel published")
	}
}
