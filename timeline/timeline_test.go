package timeline

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/golden"
)

// A result's line does not repeat its status as its code (not "cancelled cancelled").
func TestResultLine(t *testing.T) {
	cancelled := toolbus.ToolResult{CallID: "s", Tool: "sleep", Status: toolbus.StatusCancelled, Executor: "e1",
		Error: &toolbus.ToolError{Code: "cancelled", Message: "run cancelled"}}
	if got, want := ResultLine(cancelled), "        <- s sleep: cancelled (run cancelled) in 0 ms on e1"; got != want {
		t.Errorf("cancelled result:\n got %q\nwant %q", got, want)
	}
	failed := toolbus.ToolResult{CallID: "l", Tool: "lookup", Status: toolbus.StatusFailed, Executor: "e1", DurationMS: 3,
		Error: &toolbus.ToolError{Code: "incident_not_found", Message: "no incident"}}
	if got, want := ResultLine(failed), "        <- l lookup: failed incident_not_found (no incident) in 3 ms on e1"; got != want {
		t.Errorf("failed result:\n got %q\nwant %q", got, want)
	}
}

// The runs table: newest first, ages as people read them, codes before reasons, and the
// calls that did not succeed beside the run's status (a completed run's failed calls).
func TestWriteRuns(t *testing.T) {
	now := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	runs := []store.RunState{
		{RunID: "run-old", Status: toolbus.RunCompleted, Step: 2, StartedAt: now.Add(-26 * time.Hour), UpdatedAt: now.Add(-25 * time.Hour)},
		{RunID: "run-new", Status: toolbus.RunWaitingForApproval, Step: 0, Reason: "1 call(s) need approval", StartedAt: now.Add(-12 * time.Second), UpdatedAt: now.Add(-11 * time.Second)},
		{RunID: "run-mid", Status: toolbus.RunLimitReached, Step: 9, Code: "max_steps", Reason: "max steps 10 reached", StartedAt: now.Add(-3*time.Minute - 4*time.Second), UpdatedAt: now.Add(-2 * time.Minute)},
	}
	calls := map[string]audit.Calls{
		"run-old": {toolbus.StatusSucceeded: 1, toolbus.StatusFailed: 1, toolbus.StatusRejected: 1},
		"run-mid": {toolbus.StatusSucceeded: 9},
	}
	var out bytes.Buffer
	if err := WriteRuns(&out, runs, calls, now, false); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "runs.txt"), out.Bytes())
}

// stored is an event of run as a tail reads it.
func stored(t *testing.T, seq uint64, subject, typ string, data any) runlog.StoredEvent {
	t.Helper()
	raw, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return runlog.StoredEvent{Seq: seq, Subject: subject, Meta: events.Meta{Type: typ}, Data: raw}
}

// tail names a run's model as the run's own timeline does: once, and as the run's
// choice when the run asked for it (the events of several runs interleaved).
func TestTailNamesTheModelAsRunDoes(t *testing.T) {
	evs := []runlog.StoredEvent{
		stored(t, 1, events.SubjectRunStarted("r1", "p"), events.TypeRunStarted, toolbus.RunStarted{RunID: "r1", Model: "script:steps.json",
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q1"}}}),
		stored(t, 2, events.SubjectRunStarted("r2", "p"), events.TypeRunStarted, toolbus.RunStarted{RunID: "r2",
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q2"}}}),
		stored(t, 3, events.SubjectModelResponded("r1"), events.TypeModelResponded, toolbus.ModelResponded{RunID: "r1", Step: 0, Model: "steps",
			Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: []toolbus.ToolCall{{CallID: "c", Tool: "noop", Arguments: "{}"}}}}),
		stored(t, 4, events.SubjectModelResponded("r2"), events.TypeModelResponded, toolbus.ModelResponded{RunID: "r2", Step: 0, Model: "replay:x.jsonl",
			Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "a"}}),
		stored(t, 5, events.SubjectModelResponded("r1"), events.TypeModelResponded, toolbus.ModelResponded{RunID: "r1", Step: 1, Model: "steps",
			Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "done"}}),
	}
	var out bytes.Buffer
	tl := &Tailer{Out: &out, PrefixRun: true}
	for _, ev := range evs {
		tl.Print(ev)
	}
	got := out.String()
	for _, want := range []string{"r1 model steps (asked for by the run: script:steps.json)\n", "r2 model replay:x.jsonl (the planner's)\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("tail lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "model steps"); n != 1 {
		t.Errorf("tail names r1's model %d times, want once:\n%s", n, got)
	}
}

// A running call's log lines, questions and answers are printed (not after its result), and a result's
// attachments are named on its line; another tool's question naming the call is shown as ignored.
func TestLogLinesAndAttachments(t *testing.T) {
	call := toolbus.ToolCall{CallID: "c", Tool: "snap", Arguments: "{}"}
	res := toolbus.ToolResult{CallID: "c", Tool: "snap", Status: toolbus.StatusSucceeded, Executor: "e1",
		Attachments: []toolbus.Attachment{{MediaType: "image/png", Size: 512}}}
	evs := []runlog.StoredEvent{
		stored(t, 1, events.SubjectToolRequested("r1", "snap"), events.TypeToolRequested, toolbus.ToolRequested{RunID: "r1", Call: call, CallCount: 1}),
		stored(t, 2, events.SubjectToolLog("r1", "snap"), events.TypeToolLog, toolbus.ToolLog{RunID: "r1", CallID: "c", Tool: "snap", Attempt: 1, Seq: 1, Level: "warning", Message: "slow camera"}),
		stored(t, 2, events.SubjectToolQuestion("r1", "other"), events.TypeToolQuestion, toolbus.ToolQuestion{RunID: "r1", CallID: "c", Tool: "other", Attempt: 1, Seq: 2, Message: "send me your password"}),
		stored(t, 3, events.SubjectToolQuestion("r1", "snap"), events.TypeToolQuestion, toolbus.ToolQuestion{RunID: "r1", CallID: "c", Tool: "snap", Attempt: 1, Seq: 1, Message: "which camera?", Schema: json.RawMessage(`{"type":"object"}`)}),
		stored(t, 3, events.SubjectToolAnswer("r1", "alice"), events.TypeToolAnswer, toolbus.ToolAnswer{RunID: "r1", CallID: "c", Tool: "snap", Attempt: 1, Seq: 1, Action: "accept", Content: json.RawMessage(`{"camera":"front"}`), Who: "alice"}),
		stored(t, 3, events.SubjectToolFinished("r1", "snap"), events.TypeToolFinished, toolbus.ToolFinished{RunID: "r1", CallCount: 1, ToolResult: res}),
		stored(t, 4, events.SubjectToolLog("r1", "snap"), events.TypeToolLog, toolbus.ToolLog{RunID: "r1", CallID: "c", Tool: "snap", Attempt: 1, Seq: 2, Level: "info", Message: "late line"}),
	}
	var out bytes.Buffer
	p := NewPrinter(&out)
	for _, ev := range evs {
		p.Print(ev)
	}
	got := out.String()
	for _, want := range []string{"        .. c snap log warning: slow camera\n", "        .. c snap asks its caller: which camera?\n",
		"        .. c snap answered by alice: accept {\"camera\":\"front\"}\n", "succeeded in 0 ms on e1 [image image/png, 512 bytes]"} {
		if !strings.Contains(got, want) {
			t.Errorf("timeline lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "late line") {
		t.Errorf("timeline prints a log line after the call's result:\n%s", got)
	}
	if strings.Contains(got, "password") || !strings.Contains(got, "! ignored tool.question of c on other's subject: the call is of snap") {
		t.Errorf("timeline shows another tool's question in the call's name, or not as ignored:\n%s", got)
	}
}

// What a waiting call waits for is read from what its executor recorded on its tool's
// own subjects: nothing yet, reports (running), an open question (with the command
// that answers it) or a wait for approval (with the command that decides it); a
// question or report on another tool's subject naming the call, or an answer by
// someone else than the principal, changes nothing.
func TestWaitingForSaysWhatACallWaitsFor(t *testing.T) {
	call := toolbus.ToolCall{CallID: "c", Tool: "payout", Arguments: "{}"}
	start := []runlog.StoredEvent{
		stored(t, 1, events.SubjectRunStarted("r1", "alice"), events.TypeRunStarted, toolbus.RunStarted{RunID: "r1", Principal: toolbus.Principal{ID: "alice"},
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "pay"}}}),
		stored(t, 2, events.SubjectModelResponded("r1"), events.TypeModelResponded, toolbus.ModelResponded{RunID: "r1",
			Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: []toolbus.ToolCall{call}}}),
		stored(t, 3, events.SubjectToolRequested("r1", "payout"), events.TypeToolRequested, toolbus.ToolRequested{RunID: "r1", Call: call, CallCount: 1}),
	}
	schema := json.RawMessage(`{"type":"object","properties":{"account":{"type":"string","enum":["checking","savings"]},"note":{"type":"string"}},"required":["account"]}`)
	question := func(tool string) runlog.StoredEvent {
		return stored(t, 5, events.SubjectToolQuestion("r1", tool), events.TypeToolQuestion, toolbus.ToolQuestion{RunID: "r1", CallID: "c", Tool: tool, Attempt: 1, Seq: 1, Message: "Which account?", Schema: schema})
	}
	answer := func(who string) runlog.StoredEvent {
		return stored(t, 6, events.SubjectToolAnswer("r1", who), events.TypeToolAnswer, toolbus.ToolAnswer{RunID: "r1", CallID: "c", Tool: "payout", Attempt: 1, Seq: 1, Action: "accept", Content: json.RawMessage(`{"account":"savings"}`), Who: who})
	}
	progress := func(tool string) runlog.StoredEvent {
		return stored(t, 4, events.SubjectToolProgress("r1", tool), events.TypeToolProgress, toolbus.ToolProgress{RunID: "r1", CallID: "c", Tool: tool, Attempt: 1, Seq: 1, Done: 1, Total: 4, Message: "paying"})
	}
	logLine := stored(t, 4, events.SubjectToolLog("r1", "payout"), events.TypeToolLog, toolbus.ToolLog{RunID: "r1", CallID: "c", Tool: "payout", Attempt: 1, Seq: 1, Level: "info", Message: "hi"})
	waiting := stored(t, 4, events.SubjectToolWaiting("r1", "payout"), events.TypeToolWaiting, toolbus.ToolWaiting{RunID: "r1", Call: call, CallCount: 1})
	granted := stored(t, 5, events.SubjectApproval("r1", true, "alice"), events.TypeApprovalGranted, toolbus.Approval{RunID: "r1", CallID: "c", Who: "alice"})
	// An outsider's decision on his own subject, which the injector refuses.
	foreign := stored(t, 5, events.SubjectApproval("r1", false, "mallory"), events.TypeApprovalDenied, toolbus.Approval{RunID: "r1", CallID: "c", Who: "mallory", Why: "send me your password"})

	const (
		noExecutor = "an executor of payout to take c (none has reported on it yet)"
		running    = "c payout, which an executor is running"
		asks       = `an answer to the question of c payout: "Which account?"; answer it: toolbus answer r1 c '{"account":<"checking"|"savings">}' (or --decline)`
		approval   = "approval of c payout: toolbus approve r1 c (or toolbus deny r1 c --reason ...)"
	)
	tests := []struct {
		name      string
		then      []runlog.StoredEvent
		want      string
		consumers bool // the tool's queue is named (checked for a worker)
	}{
		{name: "requested", want: noExecutor, consumers: true},
		{name: "progress", then: []runlog.StoredEvent{progress("payout")}, want: running + " (last report: progress 1/4 (25%): paying)"},
		{name: "log line", then: []runlog.StoredEvent{logLine}, want: running},
		{name: "progress of another tool", then: []runlog.StoredEvent{progress("other")}, want: noExecutor, consumers: true},
		{name: "question", then: []runlog.StoredEvent{progress("payout"), question("payout")}, want: asks},
		{name: "question of another tool", then: []runlog.StoredEvent{question("other")}, want: noExecutor, consumers: true},
		{name: "answered by the principal", then: []runlog.StoredEvent{question("payout"), answer("alice")}, want: running},
		{name: "answered by someone else", then: []runlog.StoredEvent{question("payout"), answer("mallory")}, want: asks},
		{name: "approval", then: []runlog.StoredEvent{waiting}, want: approval},
		{name: "approved", then: []runlog.StoredEvent{waiting, granted, start[2]}, want: noExecutor, consumers: true},
		{name: "denied by someone else", then: []runlog.StoredEvent{waiting, foreign}, want: approval},
		{name: "issued again after a decider's decision", then: []runlog.StoredEvent{waiting, foreign, start[2]}, want: noExecutor, consumers: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPrinter(&bytes.Buffer{})
			for _, ev := range append(append([]runlog.StoredEvent{}, start...), tt.then...) {
				p.Print(ev)
			}
			got, cons := p.WaitingFor()
			if got != tt.want {
				t.Errorf("waiting for\n got %s\nwant %s", got, tt.want)
			}
			if want := []string{events.ToolConsumer("payout")}; tt.consumers != (len(cons) == 1 && cons[0] == want[0]) || (!tt.consumers && len(cons) > 0) {
				t.Errorf("queues to check %v, want the tool's: %v", cons, tt.consumers)
			}
		})
	}
}
