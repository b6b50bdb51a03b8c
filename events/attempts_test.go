package events_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
)

// The results of two executor attempts at one call (the first cut off from the bus,
// its publication stored late) are both stored, each once however often it is
// published again; a result with no attempt (the injector's timed_out) is stored only
// when no attempt's result is; Stored finds a call's result whatever its attempt.
func TestResultsOfTwoAttemptsStoredBesideEachOther(t *testing.T) {
	ctx := eventstest.Context(t, time.Minute)
	bus := eventstest.Setup(t, events.Config{})
	result := func(attempt int, content string) events.Envelope {
		return events.ToolFinishedEvent(events.Source("executor", content), toolbus.ToolFinished{RunID: "twice", Step: 0, CallIndex: 0, CallCount: 1,
			ToolResult: toolbus.ToolResult{CallID: "c", Tool: "noop", Status: toolbus.StatusSucceeded, Content: content, Attempt: attempt}})
	}
	probe := result(0, "")
	if _, found, err := bus.Stored(ctx, probe); err != nil || found {
		t.Fatalf("stored before any publish: %v %v", found, err)
	}
	for _, e := range []events.Envelope{result(1, "late"), result(1, "late"), result(2, "owner"), result(2, "owner"), result(1, "late"), result(0, "timed out")} {
		if _, err := bus.PublishEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := runlog.Read(ctx, bus.EventStream(), events.SubjectRun("twice"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		var tf toolbus.ToolFinished
		if err := json.Unmarshal(ev.Data, &tf); err != nil {
			t.Fatal(err)
		}
		got = append(got, tf.Content)
	}
	if len(got) != 2 || got[0] != "late" || got[1] != "owner" {
		t.Fatalf("stored results %q, want [late owner]", got)
	}
	if _, found, err := bus.Stored(ctx, probe); err != nil || !found {
		t.Fatalf("the call's result not found: %v %v", found, err)
	}
}
