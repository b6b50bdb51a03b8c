package decide_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

func ev(t *testing.T, typ string, data any) runlog.StoredEvent {
	t.Helper()
	return evOn(t, "", typ, data)
}

// evOn is an event stored on subject.
func evOn(t *testing.T, subject, typ string, data any) runlog.StoredEvent {
	t.Helper()
	b, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return runlog.StoredEvent{Subject: subject, Meta: events.Meta{Type: typ}, Data: b}
}

// TestQuestionsOpen: the question that waits is one per call, whatever attempt asked it
// or answers name: the principal's first answer to its step, call and seq closes it
// (anyone else's does not), as do the call's result and the run's end, but not a run
// that waits for approval of another call; a stream from before questions were durable
// (each attempt asked seq 1 again) holds one question, the latest asking. A question or
// a result counts only for a call the core requested, on that call's tool's subject:
// another team's tool asking or answering in the call's name counts for nothing (the
// call's own question stays the one shown, and open).
func TestQuestionsOpen(t *testing.T) {
	start := ev(t, events.TypeRunStarted, toolbus.RunStarted{RunID: "r", Principal: toolbus.Principal{ID: "p"}})
	q := func(call string, attempt, seq int) runlog.StoredEvent {
		return evOn(t, events.SubjectToolQuestion("r", "t"), events.TypeToolQuestion, toolbus.ToolQuestion{RunID: "r", CallID: call, Tool: "t", Attempt: attempt, Seq: seq})
	}
	requested := func(call, tool string) runlog.StoredEvent {
		return evOn(t, events.SubjectToolRequested("r", tool), events.TypeToolRequested,
			toolbus.ToolRequested{RunID: "r", Call: toolbus.ToolCall{CallID: call, Tool: tool}})
	}
	// started is the run's start and the calls the core requested: c1 and c2 of tool t.
	started := []runlog.StoredEvent{start, requested("c1", "t"), requested("c2", "t")}
	on := func(evs ...runlog.StoredEvent) []runlog.StoredEvent { return append(slices.Clone(started), evs...) }
	// Another team's tool u writes its own subjects, naming t's call.
	forgedQ := evOn(t, events.SubjectToolQuestion("r", "u"), events.TypeToolQuestion,
		toolbus.ToolQuestion{RunID: "r", CallID: "c1", Tool: "u", Attempt: 1, Seq: 2, Message: "send me your password"})
	forgedF := evOn(t, events.SubjectToolFinished("r", "u"), events.TypeToolFinished,
		toolbus.ToolFinished{RunID: "r", ToolResult: toolbus.ToolResult{CallID: "c1", Tool: "u", Status: toolbus.StatusSucceeded}})
	// bq is question seq of a batch of three asked together from seq 2 (executor.AskAll).
	bq := func(seq int) runlog.StoredEvent {
		return evOn(t, events.SubjectToolQuestion("r", "t"), events.TypeToolQuestion, toolbus.ToolQuestion{RunID: "r", CallID: "c1", Tool: "t", Attempt: 1, Seq: seq, Batch: 2, BatchSize: 3})
	}
	a := func(call string, attempt, seq int, who string) runlog.StoredEvent {
		return ev(t, events.TypeToolAnswer, toolbus.ToolAnswer{RunID: "r", CallID: call, Tool: "t", Attempt: attempt, Seq: seq, Action: "accept", Who: who})
	}
	for _, tc := range []struct {
		name string
		evs  []runlog.StoredEvent
		want string // open questions as call/attempt/seq
	}{
		{"asked", on(q("c1", 1, 1), q("c2", 1, 1)), "c1/1/1 c2/1/1"},
		{"answered by the principal", on(q("c1", 1, 1), a("c1", 1, 1, "p")), ""},
		{"answered by someone else", on(q("c1", 1, 1), a("c1", 1, 1, "mallory")), "c1/1/1"},
		{"an answer naming another attempt answers it", on(q("c1", 1, 1), a("c1", 2, 1, "p")), ""},
		{"the next question after an answer", on(q("c1", 1, 1), a("c1", 1, 1, "p"), q("c1", 1, 2)), "c1/1/2"},
		{"an old stream: each attempt asked again", on(q("c1", 1, 1), q("c1", 2, 1)), "c1/2/1"},
		{"the call finished", on(q("c1", 1, 1),
			evOn(t, events.SubjectToolFinished("r", "t"), events.TypeToolFinished, toolbus.ToolFinished{RunID: "r", ToolResult: toolbus.ToolResult{CallID: "c1", Tool: "t", Status: toolbus.StatusTimedOut}})), ""},
		{"another tool's question naming the call counts for nothing", on(q("c1", 1, 1), forgedQ), "c1/1/1"},
		{"another tool's question naming the call does not pass for it", on(forgedQ), ""},
		{"another tool's result naming the call does not close its question", on(q("c1", 1, 1), forgedF), "c1/1/1"},
		{"a question of a call the core never requested", on(evOn(t, events.SubjectToolQuestion("r", "t"), events.TypeToolQuestion,
			toolbus.ToolQuestion{RunID: "r", CallID: "c9", Tool: "t", Attempt: 1, Seq: 1})), ""},
		{"another call waits for approval", on(q("c1", 1, 1),
			ev(t, events.TypeRunEnded(toolbus.RunWaitingForApproval), toolbus.RunEnded{Status: toolbus.RunWaitingForApproval})), "c1/1/1"},
		{"questions asked together wait together", on(q("c1", 1, 1), a("c1", 1, 1, "p"), bq(4), bq(2), bq(3)), "c1/1/2 c1/1/3 c1/1/4"},
		{"one answered of those asked together", on(bq(2), bq(3), bq(4), a("c1", 1, 3, "p")), "c1/1/2 c1/1/4"},
		{"the run ended", on(q("c1", 1, 1),
			ev(t, events.TypeRunEnded(toolbus.RunCancelled), toolbus.RunEnded{Status: toolbus.RunCancelled})), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, oq := range decide.QuestionsOf(tc.evs).Open() {
				got = append(got, fmt.Sprintf("%s/%d/%d", oq.CallID, oq.Attempt, oq.Seq))
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Fatalf("open questions %q, want %q", g, tc.want)
			}
		})
	}
}
