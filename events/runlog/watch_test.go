package runlog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
)

// openBus is a bus on a fresh embedded server with the stream and buckets set up.
func openBus(t *testing.T) *events.Bus { return eventstest.Setup(t, events.Config{}) }

// Events reads one run's stored events in stream order, decoded, and marks a message
// that is not an event; Watch delivers the stored events (all) or only the next ones.
func TestRunEventsAndWatch(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	if evs, err := runlog.Events(ctx, bus, "w1"); err != nil || len(evs) != 0 {
		t.Fatalf("RunEvents of no run = %v, %v", evs, err)
	}
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "w1", Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}}); err != nil {
		t.Fatal(err)
	}
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "other"}); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.JetStream().Publish(ctx, events.SubjectRunCancel("w1", ""), []byte("not an event")); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.PublishCancel(ctx, "/test", toolbus.Cancel{RunID: "w1", Reason: "done"}); err != nil {
		t.Fatal(err)
	}

	evs, err := runlog.Events(ctx, bus, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3 (run.started, a message that is not an event, run.cancel)", len(evs))
	}
	if evs[0].Meta.Type != events.TypeRunStarted || evs[0].Err != nil || evs[0].Time.IsZero() {
		t.Fatalf("first event %+v", evs[0])
	}
	var rs toolbus.RunStarted
	if err := evs[0].Decode(&rs); err != nil || rs.Messages[0].Content != "q" {
		t.Fatalf("Decode = %+v, %v", rs, err)
	}
	if evs[1].Err == nil || !errors.Is(evs[1].Decode(&rs), evs[1].Err) {
		t.Fatalf("a message that is not an event: %+v", evs[1])
	}
	var c toolbus.Cancel
	if evs[2].Meta.Type != events.TypeRunCancel || evs[2].Decode(&c) != nil || c.Reason != "done" || evs[2].IsRunEnded() {
		t.Fatalf("last event %+v (%+v)", evs[2], c)
	}
	if !(evs[0].Seq < evs[1].Seq && evs[1].Seq < evs[2].Seq) {
		t.Fatalf("not in stream order: %d %d %d", evs[0].Seq, evs[1].Seq, evs[2].Seq)
	}

	// From the first stored event: the same events, then nothing yet.
	all, err := runlog.Watch(ctx, bus, events.SubjectRun("w1"), true)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		ev, ok, err := all.Next(ctx, 10*time.Second)
		if err != nil || !ok || ev.Seq != evs[i].Seq {
			t.Fatalf("watch event %d = %+v, %v, %v; want seq %d", i, ev, ok, err, evs[i].Seq)
		}
	}
	if ev, ok, err := all.Next(ctx, 50*time.Millisecond); ok || err != nil {
		t.Fatalf("an event after the stored ones: %+v, %v", ev, err)
	}

	// From the next stored event: only what comes after Watch.
	next, err := runlog.Watch(ctx, bus, events.SubjectRun("w1"), false)
	if err != nil {
		t.Fatal(err)
	}
	ended := toolbus.RunEnded{RunID: "w1", Status: toolbus.RunCancelled, Code: toolbus.CodeCancelled}
	msg, err := events.Encode(events.SubjectRunEnded("w1", ended.Status),
		events.Meta{ID: "w1-end", Type: events.TypeRunEnded(ended.Status), Source: "/test", RunID: "w1", Time: time.Now()}, ended)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.JetStream().PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	ev, ok, err := next.Next(ctx, 10*time.Second)
	if err != nil || !ok || !ev.IsRunEnded() {
		t.Fatalf("next event = %+v, %v, %v; want the run's outcome", ev, ok, err)
	}

	// A done context ends the watch.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := next.Next(cctx, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next after cancel: %v", err)
	}
}
