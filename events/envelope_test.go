package events_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// envelopeOf builds the envelope of an example's data with the constructor of its type.
func envelopeOf(t *testing.T, typ string, step int, data any) events.Envelope {
	t.Helper()
	const src = "/toolbus/test/1"
	switch d := data.(type) {
	case toolbus.RunStarted:
		return events.RunStartedEvent(src, d)
	case toolbus.ModelRequested:
		return events.ModelRequestedEvent(src, d)
	case toolbus.ModelResponded:
		return events.ModelRespondedEvent(src, d)
	case toolbus.ToolRequested:
		return events.ToolRequestedEvent(src, d, true)
	case toolbus.ToolFinished:
		return events.ToolFinishedEvent(src, d)
	case toolbus.ToolWaiting:
		return events.ToolWaitingEvent(src, d)
	case toolbus.ToolProgress:
		return events.ToolProgressEvent(src, d)
	case toolbus.ToolLog:
		return events.ToolLogEvent(src, d)
	case toolbus.ToolQuestion:
		return events.ToolQuestionEvent(src, d)
	case toolbus.ToolAnswer:
		return events.ToolAnswerEvent(src, d)
	case toolbus.Approval:
		return events.ApprovalEvent(src, step, d, typ == events.TypeApprovalGranted)
	case toolbus.Cancel:
		return events.CancelEvent(src, d)
	case toolbus.RunEnded:
		return events.RunEndedEvent(src, step, d)
	case events.RunTimer:
		return events.TimerEvent(src, d)
	}
	t.Fatalf("%s: no envelope constructor for %T", typ, data)
	return events.Envelope{}
}

// The envelope of every event type names the subject, id, type and extensions the
// contract documents for that data (the examples of CONTRACT.md), and its subject, id
// and extensions agree with the run, step and call the data holds: after encoding and
// decoding, nothing can disagree.
func TestEnvelopesAgreeWithData(t *testing.T) {
	call := toolbus.ToolCall{CallID: "call_9", Tool: "lookup"}
	res := toolbus.ToolResult{CallID: call.CallID, Tool: call.Tool, Status: toolbus.StatusSucceeded, Content: "ok"}
	const run, step = "run-e", 3
	cases := []struct {
		typ  string
		data any
	}{
		// Values that differ from each other (step 3, call 1 of 4), so a field taken from
		// the wrong place shows.
		{events.TypeRunStarted, toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: "alice"}}},
		{events.TypeModelRequested, toolbus.ModelRequested{RunID: run, Step: step}},
		{events.TypeModelResponded, toolbus.ModelResponded{RunID: run, Step: step}},
		{events.TypeToolRequested, toolbus.ToolRequested{RunID: run, Step: step, CallIndex: 1, CallCount: 4, Call: call}},
		{events.TypeToolFinished, toolbus.ToolFinished{RunID: run, Step: step, CallIndex: 1, CallCount: 4, ToolResult: res}},
		{events.TypeToolWaiting, toolbus.ToolWaiting{RunID: run, Step: step, CallIndex: 1, CallCount: 4, Call: call}},
		{events.TypeToolProgress, toolbus.ToolProgress{RunID: run, Step: step, CallID: call.CallID, Tool: call.Tool, Attempt: 2, Seq: 5, Done: 3, Total: 10}},
		{events.TypeToolLog, toolbus.ToolLog{RunID: run, Step: step, CallID: call.CallID, Tool: call.Tool, Attempt: 2, Seq: 4, Level: "info", Message: "m"}},
		{events.TypeToolQuestion, toolbus.ToolQuestion{RunID: run, Step: step, CallID: call.CallID, Tool: call.Tool, Attempt: 2, Seq: 1, Message: "which?", Schema: json.RawMessage(`{"type":"object"}`)}},
		{events.TypeToolAnswer, toolbus.ToolAnswer{RunID: run, Step: step, CallID: call.CallID, Tool: call.Tool, Attempt: 2, Seq: 1, Action: "accept", Content: json.RawMessage(`{"a":1}`), Who: "bob"}},
		{events.TypeApprovalGranted, toolbus.Approval{RunID: run, CallID: call.CallID, Who: "bob"}},
		{events.TypeApprovalDenied, toolbus.Approval{RunID: run, CallID: call.CallID, Who: "bob"}},
		{events.TypeRunCancel, toolbus.Cancel{RunID: run}},
		{events.TypeRunTimer, events.RunTimer{RunID: run, Deadline: time.Unix(0, 0).UTC()}},
	}
	for _, s := range []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunWaitingForApproval, toolbus.RunFailed,
		toolbus.RunLimitReached, toolbus.RunCancelled} {
		cases = append(cases, struct {
			typ  string
			data any
		}{events.TypeRunEnded(s), toolbus.RunEnded{RunID: run, Status: s, Pending: []toolbus.ToolCall{call}, StepsUsed: step + 1}})
	}
	covered := map[string]bool{}
	for _, c := range cases {
		t.Run(c.typ, func(t *testing.T) {
			covered[c.typ] = true
			e := envelopeOf(t, c.typ, step, c.data)
			msg, err := events.Encode(e.Subject, e.Meta, e.Data)
			if err != nil {
				t.Fatal(err)
			}
			var fields struct {
				RunID     string            `json:"run_id"`
				Step      *int              `json:"step"`
				CallIndex *int              `json:"call_index"`
				CallCount *int              `json:"call_count"`
				CallID    string            `json:"call_id"`
				Tool      string            `json:"tool"`
				Call      *toolbus.ToolCall `json:"call"`
			}
			m, err := events.Decode(msg, &fields)
			if err != nil {
				t.Fatal(err)
			}
			if fields.Call != nil {
				fields.CallID, fields.Tool = fields.Call.CallID, fields.Call.Tool
			}
			if m.Type != c.typ {
				t.Errorf("type %q, want %q", m.Type, c.typ)
			}
			// Subject: toolbus.<run>.<type without its prefix>[.<tool>].
			wantSubject := "toolbus." + fields.RunID + "." + strings.TrimPrefix(c.typ, "toolbus.")
			if fields.Tool != "" && c.typ != events.TypeApprovalGranted && c.typ != events.TypeApprovalDenied && c.typ != events.TypeToolAnswer {
				wantSubject += "." + fields.Tool
			}
			// and the identity the event claims (IdentityToken), which permissions bind.
			switch d := c.data.(type) {
			case toolbus.RunStarted:
				wantSubject += "." + d.Principal.ID
			case toolbus.Approval:
				wantSubject += "." + d.Who
			case toolbus.ToolAnswer:
				wantSubject += "." + d.Who
			case toolbus.Cancel:
				wantSubject += "." + events.NoIdentityToken
			}
			if msg.Subject != wantSubject {
				t.Errorf("subject %q, want %q", msg.Subject, wantSubject)
			}
			if m.RunID != fields.RunID || m.RunID != run {
				t.Errorf("runid extension %q, data run_id %q", m.RunID, fields.RunID)
			}
			if !strings.HasPrefix(m.ID, run+"/") || msg.Header.Get(events.HeaderMsgID) != m.ID {
				t.Errorf("id %q (Nats-Msg-Id %q) does not start with the run id", m.ID, msg.Header.Get(events.HeaderMsgID))
			}
			wantStep := step
			if fields.Step != nil {
				wantStep = *fields.Step
			} else if c.typ == events.TypeRunStarted || c.typ == events.TypeRunCancel || c.typ == events.TypeRunTimer {
				wantStep = 0
			}
			if m.Step != wantStep {
				t.Errorf("step extension %d, want %d", m.Step, wantStep)
			}
			if wantStep > 0 && !strings.Contains(m.ID, "/"+strconv.Itoa(wantStep)+"/") {
				t.Errorf("id %q does not name step %d", m.ID, wantStep)
			}
			if m.HasCall != (fields.CallID != "") || m.CallID != fields.CallID {
				t.Errorf("callid extension %q (present %v), data call id %q", m.CallID, m.HasCall, fields.CallID)
			}
			if fields.CallID != "" && !strings.Contains(m.ID, "/"+fields.CallID+"/") {
				t.Errorf("id %q does not name call %q", m.ID, fields.CallID)
			}
			if fields.CallIndex != nil && (m.CallIndex != *fields.CallIndex || m.CallCount != *fields.CallCount) {
				t.Errorf("call extensions %d of %d, data %d of %d", m.CallIndex, m.CallCount, *fields.CallIndex, *fields.CallCount)
			}
		})
	}
	for _, typ := range events.EventTypes() {
		if !covered[typ] {
			t.Errorf("event type %s has no envelope case", typ)
		}
	}
}

// The envelopes name what the contract's examples show: the same subject, id, type and
// extensions for the same data.
func TestEnvelopesMatchExamples(t *testing.T) {
	for _, ex := range examples() {
		e := envelopeOf(t, baseType(ex.Type), ex.Meta.Step, ex.Data)
		want := ex.Meta
		want.Type, want.Source, want.Time, want.TraceParent = baseType(ex.Type), e.Meta.Source, e.Meta.Time, e.Meta.TraceParent
		if ended, ok := ex.Data.(toolbus.RunEnded); ok && ended.Status == toolbus.RunWaitingForApproval {
			// A run waits once per remaining set of pending calls: the published id ends
			// in the set's name (the example shows the id without it).
			want.ID += "/" + events.PendingSet(ended.Pending)
		}
		if e.Subject != ex.Subject || e.Meta != want {
			got, _ := json.Marshal(e.Meta)
			exp, _ := json.Marshal(want)
			t.Errorf("%s: envelope %s %s, example %s %s", ex.Type, e.Subject, got, ex.Subject, exp)
		}
	}
}

// TestPendingSet: the id of run.waiting_for_approval names the set of pending calls, so
// the same set announced twice is one event and another set of the same size (one call
// decided, another waiting since) is a new one.
func TestPendingSet(t *testing.T) {
	c := func(ids ...string) []toolbus.ToolCall {
		out := make([]toolbus.ToolCall, len(ids))
		for i, id := range ids {
			out[i] = toolbus.ToolCall{CallID: id, Tool: "deploy"}
		}
		return out
	}
	id := func(calls []toolbus.ToolCall) string {
		return events.RunEndedEvent("s", 0, toolbus.RunEnded{RunID: "r", Status: toolbus.RunWaitingForApproval, Pending: calls}).Meta.ID
	}
	if id(c("a")) != id(c("a")) {
		t.Error("the same set has two ids")
	}
	for _, other := range [][]toolbus.ToolCall{c("b"), c("a", "b"), c("ab"), c("a", "")} {
		if id(c("a")) == id(other) {
			t.Errorf("sets {a} and %v share the id %s", other, id(other))
		}
	}
	if got := id(c("a", "b")); !strings.HasPrefix(got, "r/0/run.waiting_for_approval/2-") {
		t.Errorf("id %s, want r/0/run.waiting_for_approval/2-<hash>", got)
	}
}
