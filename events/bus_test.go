package events_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
)

func openBus(t *testing.T) *events.Bus { return eventstest.Setup(t, events.Config{}) }

func TestBusStores(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	rs := toolbus.RunStarted{RunID: "r1", Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}}
	if err := bus.StartRun(ctx, "/test", rs); err != nil {
		t.Fatal(err)
	}
	// A run id names one run: a second start is refused and publishes nothing.
	if err := bus.StartRun(ctx, "/test", rs); !errors.Is(err, events.ErrRunExists) {
		t.Fatalf("second StartRun: %v, want ErrRunExists", err)
	}
	info, err := bus.EventStream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("%d messages in the stream, want 1 (run.started only: the injector asks for step 0)", info.State.Msgs)
	}
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "bad.id"}); err == nil {
		t.Fatal("invalid run id accepted")
	}
	got, err := bus.RunStarted(ctx, "r1")
	if err != nil || got.Messages[0].Content != "q" {
		t.Fatalf("RunStarted = %+v, %v", got, err)
	}
	if _, err := bus.RunStarted(ctx, "nope"); !errors.Is(err, events.ErrRunNotFound) {
		t.Fatalf("missing run: %v", err)
	}

	// The first assistant message of a step wins.
	first := toolbus.ModelResponded{RunID: "r1", Step: 0, Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "first"}}
	if _, created, err := bus.Store().PutAssistant(ctx, first); err != nil || !created {
		t.Fatalf("PutAssistant: %v %v", created, err)
	}
	second := first
	second.Message.Content = "second"
	kept, created, err := bus.Store().PutAssistant(ctx, second)
	if err != nil || created || kept.Message.Content != "first" {
		t.Fatalf("second PutAssistant: %+v %v %v", kept, created, err)
	}

	// Join state: compare-and-set; results: one key each, the first stands.
	mr := toolbus.ModelResponded{RunID: "r1", Step: 0, Message: toolbus.Message{Role: toolbus.RoleAssistant,
		ToolCalls: []toolbus.ToolCall{{CallID: "a", Tool: "t"}, {CallID: "b", Tool: "t"}}}}
	if _, _, err := bus.Store().PutAssistant(ctx, toolbus.ModelResponded{RunID: "r1", Step: 1, Message: mr.Message}); err != nil {
		t.Fatal(err)
	}
	js := store.NewStepState("r1", 1, 2)
	rev, err := bus.Store().PutStepState(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Store().PutStepState(ctx, js, 0); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("second create: %v, want ErrConflict", err)
	}
	if _, created, err := bus.Store().PutResult(ctx, "r1", 1, 1, toolbus.ToolResult{CallID: "b", Status: toolbus.StatusSucceeded, Content: "x"}); err != nil || !created {
		t.Fatalf("PutResult: %v %v", created, err)
	}
	if kept, created, err := bus.Store().PutResult(ctx, "r1", 1, 1, toolbus.ToolResult{CallID: "b", Status: toolbus.StatusFailed}); err != nil || created || kept.Content != "x" {
		t.Fatalf("second PutResult: %+v %v %v", kept, created, err)
	}
	js.Received.Set(1)
	js.Waiting.Set(0)
	if _, err := bus.Store().PutStepState(ctx, js, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Store().PutStepState(ctx, js, rev); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("stale update: %v, want ErrConflict", err)
	}
	loaded, _, err := bus.Store().Step(ctx, "r1", 1)
	if err != nil || loaded.Received() != 1 || loaded.Complete() || !loaded.Settled() || loaded.Results[1].Content != "x" ||
		loaded.Waiting[0] == nil || loaded.Waiting[0].CallID != "a" {
		t.Fatalf("loaded %+v %v", loaded, err)
	}

	// Run state: a terminal state cannot be left.
	if err := bus.EndRun(ctx, "/test", 1, toolbus.RunEnded{RunID: "r1", Status: toolbus.RunCancelled}); err != nil {
		t.Fatal(err)
	}
	if err := bus.EndRun(ctx, "/test", 1, toolbus.RunEnded{RunID: "r1", Status: toolbus.RunCompleted}); !errors.Is(err, events.ErrRunEnded) {
		t.Fatalf("completed after cancelled: %v", err)
	}
	if err := bus.EndRun(ctx, "/test", 1, toolbus.RunEnded{RunID: "r1", Status: toolbus.RunCancelled}); err != nil {
		t.Fatalf("republishing the same outcome must be allowed: %v", err)
	}
	st, _, err := bus.Store().RunState(ctx, "r1")
	if err != nil || st.Status != toolbus.RunCancelled {
		t.Fatalf("state %+v %v", st, err)
	}

	// Large outputs.
	big := make([]byte, 3<<20+17)
	for i := range big {
		big[i] = byte(i * 7)
	}
	ref, err := bus.Store().PutOutput(ctx, "calc", "r1", 0, "call.1", big)
	if err != nil {
		t.Fatal(err)
	}
	if ref != "kv://toolbus_outputs/calc.r1.0.call=2E1" {
		t.Fatalf("ref %s", ref)
	}
	back, err := bus.Store().Output(ctx, ref)
	if err != nil || !bytes.Equal(back, big) {
		t.Fatalf("output %d bytes, %v", len(back), err)
	}
	// Written again (the call ran again), shorter: the new output, whole.
	if _, err := bus.Store().PutOutput(ctx, "calc", "r1", 0, "call.1", big[:10]); err != nil {
		t.Fatal(err)
	}
	if back, err := bus.Store().Output(ctx, ref); err != nil || !bytes.Equal(back, big[:10]) {
		t.Fatalf("output rewritten: %d bytes, %v", len(back), err)
	}
	// A chunk changed behind the meta is detected.
	kv, err := bus.JetStream().KeyValue(ctx, "toolbus_outputs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "calc.r1.0.call=2E1.0", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Store().Output(ctx, ref); !errors.Is(err, store.ErrOutputCorrupt) {
		t.Fatalf("corrupt output read: %v", err)
	}
}
