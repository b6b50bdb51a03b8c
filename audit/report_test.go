package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/internal/golden"
)

// runLog builds the stored events of one run as toolbus publishes them: encoded as
// CloudEvents and decoded back, as replay reads them.
type runLog struct {
	t   *testing.T
	run string
	t0  time.Time
	at  time.Duration
	evs []runlog.StoredEvent
}

func newRunLog(t *testing.T, run string) *runLog {
	return &runLog{t: t, run: run, t0: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
}

// add stores one event ms milliseconds after the previous one.
func (l *runLog) add(ms int, subject string, m events.Meta, data any) {
	l.t.Helper()
	l.at += time.Duration(ms) * time.Millisecond
	m.RunID, m.Time = l.run, l.t0.Add(l.at)
	if m.Source == "" {
		m.Source = "/toolbus/test/1"
	}
	msg, err := events.Encode(subject, m, data)
	if err != nil {
		l.t.Fatal(err)
	}
	var raw json.RawMessage
	meta, err := events.Decode(msg, &raw)
	if err != nil {
		l.t.Fatal(err)
	}
	l.evs = append(l.evs, runlog.StoredEvent{Seq: uint64(len(l.evs) + 1), Subject: subject, Time: m.Time, Meta: meta, Data: raw})
}

func (l *runLog) started(msgs ...toolbus.Message) {
	l.add(0, events.SubjectRunStarted(l.run, "cli"), events.Meta{ID: events.IDRunStarted(l.run), Type: events.TypeRunStarted},
		toolbus.RunStarted{RunID: l.run, Messages: msgs, Model: "script", Principal: toolbus.Principal{ID: "cli"},
			Limits: toolbus.Limits{MaxSteps: 10, Deadline: l.t0.Add(10 * time.Minute)}, StartedAt: l.t0})
}

func (l *runLog) requested(ms, step int) {
	l.add(ms, events.SubjectModelRequested(l.run), events.Meta{ID: events.IDModelRequested(l.run, step), Type: events.TypeModelRequested, Step: step},
		toolbus.ModelRequested{RunID: l.run, Step: step})
}

func (l *runLog) responded(ms, step int, content string, tokens int64, calls ...toolbus.ToolCall) {
	l.add(ms, events.SubjectModelResponded(l.run), events.Meta{ID: events.IDModelResponded(l.run, step), Type: events.TypeModelResponded, Step: step},
		toolbus.ModelResponded{RunID: l.run, Step: step, Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: content, ToolCalls: calls},
			Usage: toolbus.Usage{InputTokens: tokens * 4 / 5, OutputTokens: tokens / 5}, Model: "script", LatencyMS: int64(ms)})
}

func (l *runLog) toolRequested(ms, step, idx, n int, c toolbus.ToolCall, approved bool) {
	l.add(ms, events.SubjectToolRequested(l.run, c.Tool), events.Meta{ID: events.IDToolRequested(l.run, step, c.CallID, approved),
		Type: events.TypeToolRequested, Step: step, CallID: c.CallID, CallIndex: idx, CallCount: n},
		toolbus.ToolRequested{RunID: l.run, Step: step, CallIndex: idx, CallCount: n, Call: c, Approved: approved})
}

func (l *runLog) finished(ms, step, idx, n int, r toolbus.ToolResult, id string) {
	if id == "" {
		id = events.IDToolFinished(l.run, step, r.CallID)
	}
	if r.Executor == "" {
		r.Executor = "exec-1"
	}
	r.DurationMS = int64(ms)
	l.add(ms, events.SubjectToolFinished(l.run, r.Tool), events.Meta{ID: id, Type: events.TypeToolFinished, Step: step,
		CallID: r.CallID, CallIndex: idx, CallCount: n},
		toolbus.ToolFinished{RunID: l.run, Step: step, CallIndex: idx, CallCount: n, ToolResult: r})
}

func (l *runLog) waiting(ms, step, idx, n int, c toolbus.ToolCall) {
	l.add(ms, events.SubjectToolWaiting(l.run, c.Tool), events.Meta{ID: events.IDToolWaiting(l.run, step, c.CallID),
		Type: events.TypeToolWaiting, Step: step, CallID: c.CallID, CallIndex: idx, CallCount: n},
		toolbus.ToolWaiting{RunID: l.run, Step: step, CallIndex: idx, CallCount: n, Call: c})
}

func (l *runLog) approval(ms, step int, callID string, granted bool, who, why string) {
	typ := events.TypeApprovalDenied
	if granted {
		typ = events.TypeApprovalGranted
	}
	l.add(ms, events.SubjectApproval(l.run, granted, who), events.Meta{ID: "a-" + callID, Type: typ, Step: step, CallID: callID},
		toolbus.Approval{RunID: l.run, CallID: callID, Who: who, Why: why})
}

func (l *runLog) cancel(ms int, reason, who string) {
	l.add(ms, events.SubjectRunCancel(l.run, who), events.Meta{ID: events.IDRunCancel(l.run), Type: events.TypeRunCancel},
		toolbus.Cancel{RunID: l.run, Reason: reason, Who: who})
}

func (l *runLog) ended(ms, step int, re toolbus.RunEnded) {
	re.RunID = l.run
	l.add(ms, events.SubjectRunEnded(l.run, re.Status), events.Meta{ID: events.IDRunEnded(l.run, step, re.Status) + "/" + string(rune('a'+len(l.evs))),
		Type: events.TypeRunEnded(re.Status), Step: step}, re)
}

func rcall(id, tool, args string) toolbus.ToolCall {
	return toolbus.ToolCall{CallID: id, Tool: tool, Arguments: args}
}

func rok(id, tool, content string) toolbus.ToolResult {
	return toolbus.ToolResult{CallID: id, Tool: tool, Status: toolbus.StatusSucceeded, Content: content, Attempt: 1}
}

func rfail(id, tool string, st toolbus.Status, code, msg string) toolbus.ToolResult {
	return toolbus.ToolResult{CallID: id, Tool: tool, Status: st, Error: &toolbus.ToolError{Code: code, Message: msg},
		Content: `{"error":{"code":"` + code + `","message":"` + msg + `"}}`, Attempt: 1}
}

var replayInput = []toolbus.Message{
	{Role: toolbus.RoleSystem, Content: "You are an on-call assistant."},
	{Role: toolbus.RoleUser, Content: "What is going on with INC-404?"},
}

// replayCases are the event logs of the golden tests.
var replayCases = map[string]func(l *runLog){
	// Two calls finishing out of order, a repaired call, an answer.
	"completed": func(l *runLog) {
		lookup404, calc := rcall("call_lookup", "lookup_incident", `{"incident_id":"INC-404"}`), rcall("call_calc", "calculator", `{"expression":"17 * 38 + 55"}`)
		lookup001 := rcall("call_lookup", "lookup_incident", `{"incident_id":"INC-001"}`)
		l.started(replayInput...)
		l.requested(0, 0)
		l.responded(12, 0, "Let me look the incident up.", 150, lookup404, calc)
		l.toolRequested(1, 0, 0, 2, lookup404, false)
		l.toolRequested(0, 0, 1, 2, calc, false)
		l.finished(2, 0, 1, 2, rok("call_calc", "calculator", `{"value":701}`), "")
		l.finished(3, 0, 0, 2, rfail("call_lookup", "lookup_incident", toolbus.StatusFailed, "incident_not_found", "no incident INC-404"), "")
		l.requested(1, 1)
		l.responded(9, 1, "INC-404 does not exist; trying INC-001.", 300, lookup001)
		l.toolRequested(1, 1, 0, 1, lookup001, false)
		l.finished(4, 1, 0, 1, rok("call_lookup", "lookup_incident", `{"incident_id":"INC-001","severity":"high"}`), "")
		l.requested(1, 2)
		l.responded(8, 2, "INC-001 is a high-severity incident.", 460)
		l.ended(1, 2, toolbus.RunEnded{Status: toolbus.RunCompleted, Answer: "INC-001 is a high-severity incident.", StepsUsed: 3,
			Usage: toolbus.Usage{InputTokens: 728, OutputTokens: 182}})
	},
	// A step mixing an ordinary call and one that needs approval; granted.
	"approval": func(l *runLog) {
		noop, deploy := rcall("a", "noop", `{}`), rcall("b", "deploy", `{"service":"api"}`)
		l.started(replayInput...)
		l.requested(0, 0)
		l.responded(5, 0, "", 100, noop, deploy)
		l.toolRequested(1, 0, 0, 2, noop, false)
		l.toolRequested(0, 0, 1, 2, deploy, false)
		l.finished(1, 0, 0, 2, rok("a", "noop", `{}`), "")
		l.waiting(1, 0, 1, 2, deploy)
		l.ended(1, 0, toolbus.RunEnded{Status: toolbus.RunWaitingForApproval, Pending: []toolbus.ToolCall{deploy}, StepsUsed: 1, Reason: "1 call(s) need approval"})
		l.approval(60000, 0, "b", true, "alice", "change CHG-1")
		l.toolRequested(2, 0, 1, 2, deploy, true)
		l.finished(30, 0, 1, 2, rok("b", "deploy", `{"deployed":"api"}`), "")
		l.requested(1, 1)
		l.responded(4, 1, "Deployed.", 120)
		l.ended(1, 1, toolbus.RunEnded{Status: toolbus.RunCompleted, Answer: "Deployed.", StepsUsed: 2})
	},
	// A run that waits for a decision: its pending call has no result, which is fine.
	"waiting": func(l *runLog) {
		deploy := rcall("b", "deploy", `{"service":"db"}`)
		l.started(replayInput...)
		l.requested(0, 0)
		l.responded(5, 0, "", 100, deploy)
		l.toolRequested(1, 0, 0, 1, deploy, false)
		l.waiting(1, 0, 0, 1, deploy)
		l.ended(1, 0, toolbus.RunEnded{Status: toolbus.RunWaitingForApproval, Pending: []toolbus.ToolCall{deploy}, StepsUsed: 1})
	},
	// A denied call goes back to the model as rejected / approval_denied.
	"denied": func(l *runLog) {
		deploy := rcall("b", "deploy", `{"service":"db"}`)
		l.started(replayInput...)
		l.requested(0, 0)
		l.responded(5, 0, "", 100, deploy)
		l.toolRequested(1, 0, 0, 1, deploy, false)
		l.waiting(1, 0, 0, 1, deploy)
		l.ended(1, 0, toolbus.RunEnded{Status: toolbus.RunWaitingForApproval, Pending: []toolbus.ToolCall{deploy}, StepsUsed: 1})
		l.approval(1000, 0, "b", false, "bob", "freeze until Monday")
		l.toolRequested(1, 0, 0, 1, deploy, true)
		l.finished(1, 0, 0, 1, rfail("b", "deploy", toolbus.StatusRejected, "approval_denied", "a person denied this call: freeze until Monday"), "")
		l.requested(1, 1)
		l.responded(4, 1, "The deploy was denied.", 100)
		l.ended(1, 1, toolbus.RunEnded{Status: toolbus.RunCompleted, Answer: "The deploy was denied.", StepsUsed: 2})
	},
	// Cancelled while a call sleeps: its cancelled result comes after the end.
	"cancelled": func(l *runLog) {
		sleep := rcall("s", "sleep", `{"ms":60000}`)
		l.started(replayInput...)
		l.requested(0, 0)
		l.responded(5, 0, "", 100, sleep)
		l.toolRequested(1, 0, 0, 1, sleep, false)
		l.cancel(800, "wrong incident", "bob")
		l.ended(1, 0, toolbus.RunEnded{Status: toolbus.RunCancelled, Code: "cancelled", Reason: "wrong incident (by bob)", StepsUsed: 1})
		l.finished(2, 0, 0, 1, rfail("s", "sleep", toolbus.StatusCancelled, "cancelled", "the call was cancelled while running"), "")
	},
	// The token budget stops a step whose calls are then never requested.
	"token_budget": func(l *runLog) {
		l.started(replayInput...)
		l.requested(0, 0)
		l.responded(5, 0, "", 900, rcall("n", "noop", `{}`))
		l.ended(1, 0, toolbus.RunEnded{Status: toolbus.RunLimitReached, Code: toolbus.LimitTokenBudget, StepsUsed: 1,
			Reason: "token budget 500 exceeded: 900 tokens used", Usage: toolbus.Usage{InputTokens: 720, OutputTokens: 180}})
	},
	// Every invariant broken once.
	"violations": func(l *runLog) {
		x, y := rcall("x", "noop", `{}`), rcall("y", "noop", `{}`)
		l.started(replayInput...)
		l.requested(0, 0)
		l.responded(5, 0, "", 100, x, y)
		l.toolRequested(1, 0, 0, 2, x, false)
		l.toolRequested(0, 0, 1, 2, y, false)
		l.finished(1, 0, 0, 2, rok("x", "noop", `{}`), "")
		l.requested(1, 1)                                              // before y's result
		l.finished(1, 0, 0, 2, rok("y", "noop", `{}`), "")             // y carries x's index
		l.finished(1, 0, 0, 2, rok("x", "noop", `{"again":1}`), "dup") // a second result for x
		l.finished(1, 0, 2, 3, rok("z", "noop", `{}`), "")             // nobody asked for z
		l.responded(3, 1, "done", 100)
		l.ended(1, 1, toolbus.RunEnded{Status: toolbus.RunCompleted, Answer: "done", StepsUsed: 2})
		l.ended(1, 1, toolbus.RunEnded{Status: toolbus.RunFailed, Code: "tool_internal_error", StepsUsed: 2})
		l.requested(1, 2)
	},
	// A request whose result never came, in a run that completed anyway.
	"missing_result": func(l *runLog) {
		x, y := rcall("x", "noop", `{}`), rcall("y", "noop", `{}`)
		l.started(replayInput...)
		l.requested(0, 0)
		l.responded(5, 0, "", 100, x, y)
		l.toolRequested(1, 0, 0, 2, x, false)
		l.toolRequested(0, 0, 1, 2, y, false)
		l.finished(1, 0, 0, 2, rok("x", "noop", `{}`), "")
		l.requested(1, 1)
		l.responded(3, 1, "done", 100)
		l.ended(1, 1, toolbus.RunEnded{Status: toolbus.RunCompleted, Answer: "done", StepsUsed: 2})
	},
}

func TestAnalyzeGolden(t *testing.T) {
	for name, build := range replayCases {
		t.Run(name, func(t *testing.T) {
			l := newRunLog(t, "run-"+strings.ReplaceAll(name, "_", "-"))
			build(l)
			r := Analyze(l.run, l.evs)
			var text bytes.Buffer
			r.WriteText(&text)
			var js bytes.Buffer
			if err := writeJSON(&js, r); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, filepath.Join("testdata", name+".txt"), text.Bytes())
			golden.Check(t, filepath.Join("testdata", name+".json"), js.Bytes())
			wantOK := name != "violations" && name != "missing_result"
			if r.OK != wantOK {
				t.Fatalf("ok = %v, want %v: %+v", r.OK, wantOK, r.Violations)
			}
		})
	}
}

// The violations case finds each broken invariant.
func TestAnalyzeViolations(t *testing.T) {
	l := newRunLog(t, "run-v")
	replayCases["violations"](l)
	r := Analyze(l.run, l.evs)
	got := map[string]int{}
	for _, v := range r.Violations {
		got[v.Code]++
	}
	for _, code := range []string{ViolationStepOrder, ViolationCallOrder, ViolationDuplicateResult, ViolationOrphanResult, ViolationTerminal} {
		if got[code] == 0 {
			t.Errorf("no %s violation in %+v", code, r.Violations)
		}
	}
	// The first result stands: the transcript has x's first content.
	for _, m := range r.Transcript {
		if m.Role == toolbus.RoleTool && m.ToolCallID == "x" && m.Content != `{}` {
			t.Fatalf("transcript kept the duplicate: %+v", m)
		}
	}
}

// The transcript is the history the model was sent: inputs, each assistant message
// whole, its tool messages in call order (not in finishing order).
func TestAnalyzeTranscriptInCallOrder(t *testing.T) {
	l := newRunLog(t, "run-t")
	replayCases["completed"](l)
	r := Analyze(l.run, l.evs)
	var roles []string
	for _, m := range r.Transcript {
		s := string(m.Role)
		if m.Role == toolbus.RoleTool {
			s += ":" + m.ToolCallID
		}
		roles = append(roles, s)
	}
	if got, want := strings.Join(roles, ","), "system,user,assistant,tool:call_lookup,tool:call_calc,assistant,tool:call_lookup,assistant"; got != want {
		t.Fatalf("transcript %s, want %s", got, want)
	}
	if got := r.Transcript[3]; !got.IsError || got.Name != "lookup_incident" {
		t.Fatalf("tool message %+v", got)
	}
	want := []ModelRequest{{Step: 0, Seq: 2, Messages: 2}, {Step: 1, Seq: 8, Messages: 5}, {Step: 2, Seq: 12, Messages: 7}}
	if g, w := mustJSON(t, r.Requests), mustJSON(t, want); g != w {
		t.Fatalf("requests %s, want %s", g, w)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writeJSON prints v as `toolbus replay --json` does: indented, with <, > and & as they are.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Counts in the report are English.
func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 results", 1: "1 result", 2: "2 results"} {
		if got := plural(n, "result"); got != want {
			t.Errorf("plural(%d) = %q, want %q", n, got, want)
		}
	}
}

func (l *runLog) progress(ms, step int, c toolbus.ToolCall, seq int, done, total float64, msg string) {
	l.add(ms, events.SubjectToolProgress(l.run, c.Tool), events.Meta{ID: events.IDToolProgress(l.run, step, c.CallID, 1, seq),
		Type: events.TypeToolProgress, Step: step, CallID: c.CallID},
		toolbus.ToolProgress{RunID: l.run, Step: step, CallID: c.CallID, Tool: c.Tool, Attempt: 1, Seq: seq, Done: done, Total: total, Message: msg})
}

// TestAnalyzeProgress: a report of a running call is in the timeline; one of a call that
// is not running (never requested, or after its result) is ignored and flagged.
func TestAnalyzeProgress(t *testing.T) {
	l := newRunLog(t, "run-p")
	c := rcall("c1", "crawl", `{}`)
	l.started(toolbus.Message{Role: toolbus.RoleUser, Content: "crawl"})
	l.requested(1, 0)
	l.responded(1, 0, "", 10, c)
	l.progress(1, 0, rcall("ghost", "crawl", `{}`), 1, 1, 0, "") // never requested
	l.toolRequested(1, 0, 0, 1, c, false)
	l.progress(5, 0, c, 1, 40, 120, "searched 40 archives")
	l.finished(5, 0, 0, 1, rok("c1", "crawl", "done"), "")
	l.progress(5, 0, c, 2, 120, 120, "late")
	r := Analyze(l.run, l.evs)
	var summaries []string
	for _, e := range r.Timeline {
		if e.Type == "tool.progress" {
			summaries = append(summaries, e.Summary)
		}
	}
	want := []string{
		"ignored: progress for a call that is not running (progress 1)",
		"progress 40/120 (33%): searched 40 archives",
		"ignored: progress for a call that is not running (progress 120/120 (100%): late)",
	}
	if strings.Join(summaries, "\n") != strings.Join(want, "\n") {
		t.Fatalf("progress in the timeline:\n%s\nwant:\n%s", strings.Join(summaries, "\n"), strings.Join(want, "\n"))
	}
	n := 0
	for _, v := range r.Violations {
		if v.Code == ViolationProgressNotRunning {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d progress_not_running violations, want 2: %+v", n, r.Violations)
	}
}

// A script shipped with the run (script:{...}, up to 64 KiB) is named by its size in
// the timeline, never printed whole; other models are named as they are.
func TestModelNameOfAShippedScript(t *testing.T) {
	script := `script:{"steps":[` + strings.Repeat(`{"answer":"x"},`, 2000) + `{"answer":"done"}]}`
	for _, c := range []struct{ model, want string }{
		{script, fmt.Sprintf("a script shipped with the run (%d bytes)", len(script)-len("script:"))},
		{"script:incident", "script:incident"},
		{"anthropic:claude", "anthropic:claude"},
	} {
		if got := ModelName(c.model); got != c.want {
			t.Errorf("ModelName(%.40q) = %q, want %q", c.model, got, c.want)
		}
	}
	l := newRunLog(t, "run-s")
	l.add(0, events.SubjectRunStarted(l.run, "cli"), events.Meta{ID: events.IDRunStarted(l.run), Type: events.TypeRunStarted},
		toolbus.RunStarted{RunID: l.run, Model: script, Principal: toolbus.Principal{ID: "cli"}, StartedAt: l.t0})
	r := Analyze(l.run, l.evs)
	if len(r.Timeline) == 0 || strings.Contains(r.Timeline[0].Summary, `"steps"`) || !strings.Contains(r.Timeline[0].Summary, "shipped with the run") {
		t.Fatalf("the run's start reads %q", r.Timeline[0].Summary)
	}
}

// TestAnalyzeToolLog: a call's log line is in the timeline with its call and level.
func TestAnalyzeToolLog(t *testing.T) {
	l := newRunLog(t, "run-l")
	c := rcall("c1", "crawl", `{}`)
	l.started(toolbus.Message{Role: toolbus.RoleUser, Content: "crawl"})
	l.requested(1, 0)
	l.responded(1, 0, "", 10, c)
	l.toolRequested(1, 0, 0, 1, c, false)
	l.add(3, events.SubjectToolLog(l.run, c.Tool), events.Meta{ID: events.IDToolLog(l.run, 0, c.CallID, 1, 1), Type: events.TypeToolLog, Step: 0, CallID: c.CallID},
		toolbus.ToolLog{RunID: l.run, CallID: c.CallID, Tool: c.Tool, Attempt: 1, Seq: 1, Level: "warning", Message: "archive slow"})
	r := Analyze(l.run, l.evs)
	for _, e := range r.Timeline {
		if e.Type == "tool.log" {
			if e.Summary != "log warning: archive slow" || e.CallID != "c1" || e.Tool != "crawl" {
				t.Fatalf("timeline entry %+v", e)
			}
			return
		}
	}
	t.Fatal("the timeline has no tool.log entry")
}

// Another tool's result naming a call (its team writes its own tool's result subject) is
// no result of the call: it is recorded as an orphan_result and ignored, and the call's
// own result, stored after it, stands in the calls and the transcript.
func TestAnalyzeAnotherToolsResultIgnored(t *testing.T) {
	l := newRunLog(t, "run-foreign")
	l.started(replayInput...)
	l.requested(1, 0)
	c := rcall("c", "payroll", `{}`)
	l.responded(1, 0, "", 10, c)
	l.toolRequested(1, 0, 0, 1, c, false)
	l.finished(1, 0, 0, 1, rok("c", "websearch", "forged by search"), "forged")
	l.finished(1, 0, 0, 1, rok("c", "payroll", "paid"), "")
	r := Analyze(l.run, l.evs)
	if len(r.Calls) != 1 || r.Calls[0].Result == nil || r.Calls[0].Result.Content != "paid" || r.Calls[0].Results != 1 {
		t.Fatalf("calls %+v, want c with payroll's result alone", r.Calls)
	}
	var orphans int
	for _, v := range r.Violations {
		if v.Code == ViolationOrphanResult && strings.Contains(v.Message, "websearch") {
			orphans++
		}
	}
	if orphans != 1 {
		t.Fatalf("violations %+v, want one orphan_result naming websearch", r.Violations)
	}
	for _, m := range r.Transcript {
		if strings.Contains(m.Content, "forged") {
			t.Fatalf("the transcript holds another tool's result: %+v", m)
		}
	}
}
