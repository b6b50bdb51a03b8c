package decide_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/decide"
)

func ev(t *testing.T, typ string, data any) events.StoredEvent {
	t.Helper()
	b, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return events.StoredEvent{Meta: events.Meta{Type: typ}, Data: b}
}

// TestQuestionsOpen: the question that waits is one per call, whatever attempt asked it
// or answers name: the principal's first answer to its step, call and seq closes it
// (anyone else's does not), as do the call's result and the run's end, but not a run
// that waits for approval of another call; a stream from before questions were durable
// (each attempt asked seq 1 again) holds one question, the latest asking.
func TestQuestionsOpen(t *testing.T) {
	started := ev(t, events.TypeRunStarted, toolbus.RunStarted{RunID: "r", Principal: toolbus.Principal{ID: "p"}})
	q := func(call string, attempt, seq int) events.StoredEvent {
		return ev(t, events.TypeToolQuestion, toolbus.ToolQuestion{RunID: "r", CallID: call, Tool: "t", Attempt: attempt, Seq: seq})
	}
	a := func(call string, attempt, seq int, who string) events.StoredEvent {
		return ev(t, events.TypeToolAnswer, toolbus.ToolAnswer{RunID: "r", CallID: call, Tool: "t", Attempt: attempt, Seq: seq, Action: "accept", Who: who})
	}
	for _, tc := range []struct {
		name string
		evs  []events.StoredEvent
		want string // open questions as call/attempt/seq
	}{
		{"asked", []events.StoredEvent{started, q("c1", 1, 1), q("c2", 1, 1)}, "c1/1/1 c2/1/1"},
		{"answered by the principal", []events.StoredEvent{started, q("c1", 1, 1), a("c1", 1, 1, "p")}, ""},
		{"answered by someone else", []events.StoredEvent{started, q("c1", 1, 1), a("c1", 1, 1, "mallory")}, "c1/1/1"},
		{"an answer naming another attempt answers it", []events.StoredEvent{started, q("c1", 1, 1), a("c1", 2, 1, "p")}, ""},
		{"the next question after an answer", []events.StoredEvent{started, q("c1", 1, 1), a("c1", 1, 1, "p"), q("c1", 1, 2)}, "c1/1/2"},
		{"an old stream: each attempt asked again", []events.StoredEvent{started, q("c1", 1, 1), q("c1", 2, 1)}, "c1/2/1"},
		{"the call finished", []events.StoredEvent{started, q("c1", 1, 1),
			ev(t, events.TypeToolFinished, toolbus.ToolFinished{RunID: "r", ToolResult: toolbus.ToolResult{CallID: "c1", Tool: "t", Status: toolbus.StatusTimedOut}})}, ""},
		{"another call waits for approval", []events.StoredEvent{started, q("c1", 1, 1),
			ev(t, events.TypeRunEnded(toolbus.RunWaitingForApproval), toolbus.RunEnded{Status: toolbus.RunWaitingForApproval})}, "c1/1/1"},
		{"the run ended", []events.StoredEvent{started, q("c1", 1, 1),
			ev(t, events.TypeRunEnded(toolbus.RunCancelled), toolbus.RunEnded{Status: toolbus.RunCancelled})}, ""},
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
