package audit

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Violation codes of the report.
const (
	ViolationNoRunStarted    = "no_run_started"    // the run's events have no run.started
	ViolationUndecodable     = "undecodable_event" // a message on the run's subjects is not a toolbus event
	ViolationDuplicateResult = "duplicate_result"  // more than one tool.finished for one call (step + call_id)
	ViolationOrphanResult    = "orphan_result"     // a tool.finished with no tool.requested before it
	ViolationMissingResult   = "missing_result"    // a tool.requested that never got its result
	ViolationMissingRequest  = "missing_request"   // a call the model asked for was never requested, yet the run went on
	ViolationCallOrder       = "call_order"        // a request or result whose call_index is not the call's position
	ViolationUnknownCall     = "unknown_call"      // a request for a call the model did not ask for
	ViolationStepOrder       = "step_order"        // a step requested out of order or before the results it needs
	ViolationTerminal        = "terminal_state"    // not exactly one terminal outcome, last
	// ViolationSubjectMismatch: an event whose subject and body disagree (another run,
	// tool, status or type than its subject names); consumers terminated it and it
	// counts for no run.
	ViolationSubjectMismatch = "subject_mismatch"
	// ViolationProgressNotRunning: a tool.progress for a call that was not running (no
	// tool.requested before it, or after its tool.finished); readers ignore it.
	ViolationProgressNotRunning = "progress_not_running"
)

// Violation is one broken invariant.
type Violation struct {
	Code    string `json:"code"`
	Seq     uint64 `json:"seq,omitempty"`
	Step    int    `json:"step"`
	CallID  string `json:"call_id,omitempty"`
	Message string `json:"message"`
}

// TimelineEntry is one event of the timeline, in stream order.
type TimelineEntry struct {
	Seq        uint64   `json:"seq"`
	AtMS       int64    `json:"at_ms"`
	Type       string   `json:"type"`
	Step       int      `json:"step"`
	CallID     string   `json:"call_id,omitempty"`
	Tool       string   `json:"tool,omitempty"`
	Status     string   `json:"status,omitempty"`
	Code       string   `json:"code,omitempty"`
	DurationMS int64    `json:"duration_ms,omitempty"`
	Executor   string   `json:"executor,omitempty"`
	Source     string   `json:"source,omitempty"`
	Summary    string   `json:"summary"`
	Details    []string `json:"details,omitempty"`
	// AfterEnd marks events stored after the run's terminal outcome (late results,
	// ignored approvals).
	AfterEnd bool `json:"after_end,omitempty"`
}

// ModelRequest says how much of the transcript the model was sent at a step.
type ModelRequest struct {
	Step     int    `json:"step"`
	Seq      uint64 `json:"seq"`
	Messages int    `json:"messages"`
}

// Call is the audit of one call.
type Call struct {
	Step      int    `json:"step"`
	Index     int    `json:"index"`
	CallID    string `json:"call_id"`
	Tool      string `json:"tool"`
	Arguments string `json:"arguments"`
	Requested int    `json:"requested"`
	Waited    bool   `json:"waited,omitempty"`
	Decision  string `json:"decision,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"`
	// DecidedWhy is the reason the decider gave.
	DecidedWhy string `json:"decided_why,omitempty"`
	// DecisionKind is what the person decided (toolbus.Approval.Kind): approved, edited,
	// rejected or responded.
	DecisionKind string `json:"decision_kind,omitempty"`
	// EditedArguments are the person's arguments the call ran with instead of the
	// model's (Arguments), for an edit.
	EditedArguments string `json:"edited_arguments,omitempty"`
	// Response is the person's answer in the tool's place, for a response.
	Response string              `json:"response,omitempty"`
	Results  int                 `json:"results"`
	Result   *toolbus.ToolResult `json:"result,omitempty"`
	// Progress is the call's last progress report while it ran (tool.progress).
	Progress *toolbus.ToolProgress `json:"progress,omitempty"`
}

// ProgressText says how far the call had come by its last report ("" without one).
func (c Call) ProgressText() string {
	if c.Progress == nil {
		return ""
	}
	return ProgressText(*c.Progress)
}

// Report is the audit of one run (`toolbus replay --json` prints it as is).
type Report struct {
	RunID   string             `json:"run_id"`
	Status  toolbus.RunStatus  `json:"status"`
	Code    string             `json:"code,omitempty"`
	Reason  string             `json:"reason,omitempty"`
	Answer  string             `json:"answer,omitempty"`
	Pending []toolbus.ToolCall `json:"pending,omitempty"`
	// Model is the model the run named (RunStarted.Model), else the one that answered
	// its first step (the planner's own).
	Model      string          `json:"model,omitempty"`
	Principal  string          `json:"principal,omitempty"`
	Limits     toolbus.Limits  `json:"limits"`
	StartedAt  time.Time       `json:"started_at,omitzero"`
	DurationMS int64           `json:"duration_ms"`
	Steps      int             `json:"steps"`
	Usage      toolbus.Usage   `json:"usage"`
	Events     int             `json:"events"`
	Timeline   []TimelineEntry `json:"timeline"`
	Calls      []Call          `json:"calls"`
	// Transcript is the conversation as the model was sent it: the run's input
	// messages, then per step the assistant message whole and its tool messages in call
	// order; the last message is the model's last answer. Requests say how many of
	// these messages each step's request carried.
	Transcript []toolbus.Message `json:"transcript"`
	Requests   []ModelRequest    `json:"model_requests"`
	Violations []Violation       `json:"violations"`
	OK         bool              `json:"ok"`
}

type callKey struct {
	step int
	id   string
}

// stepState is what the analysis knows of one step while it reads the events.
type stepState struct {
	requestedSeq uint64
	responded    *toolbus.ModelResponded
	calls        map[string]*Call
}

// analysis is the state of Analyze while it walks the events.
type analysis struct {
	r         *Report
	started   *toolbus.RunStarted
	startTime time.Time
	steps     map[int]*stepState
	lastStep  int // highest step requested
	terminal  *TimelineEntry
	order     []callKey // calls in the order the model asked for them
	e         *TimelineEntry
	// decisions are the approval events of each call, in stream order: the result names
	// the one that stood (ToolResult.Human) when the decision policy refused others.
	decisions map[callKey][]decisionEvent
}

// decisionEvent is one approval.granted or approval.denied of a call.
type decisionEvent struct {
	ap      toolbus.Approval
	granted bool
}

// Analyze audits the events of one run, given in stream order (runlog.Events).
// It reads no store and no clock: the same events give the same report.
func Analyze(run string, evs []runlog.StoredEvent) *Report {
	a := &analysis{
		r: &Report{RunID: run, Status: toolbus.RunRunning, Events: len(evs), Timeline: []TimelineEntry{},
			Calls: []Call{}, Transcript: []toolbus.Message{}, Requests: []ModelRequest{}, Violations: []Violation{}},
		steps: map[int]*stepState{}, lastStep: -1, decisions: map[callKey][]decisionEvent{},
	}
	v := Visitor{
		RunStarted: a.runStarted, ModelRequested: a.modelRequested, ModelResponded: a.modelResponded,
		ToolRequested: a.toolRequested, ToolWaiting: a.toolWaiting, ToolFinished: a.toolFinished, ToolProgress: a.toolProgress,
		ToolLog: func(_ runlog.StoredEvent, tl toolbus.ToolLog) {
			a.e.Step, a.e.CallID, a.e.Tool = tl.Step, tl.CallID, tl.Tool
			a.e.Summary = "log " + tl.Level + ": " + tl.Message
		},
		ToolQuestion: func(_ runlog.StoredEvent, q toolbus.ToolQuestion) {
			a.e.Step, a.e.CallID, a.e.Tool = q.Step, q.CallID, q.Tool
			a.e.Summary = "asks its caller: " + q.Message
		},
		ToolAnswer: func(_ runlog.StoredEvent, an toolbus.ToolAnswer) {
			a.e.Step, a.e.CallID, a.e.Tool = an.Step, an.CallID, an.Tool
			a.e.Summary = "answered by " + an.Who + ": " + an.Action
			if len(an.Content) > 0 {
				a.e.Summary += " " + string(an.Content)
			}
			if an.Reason != "" {
				a.e.Summary += " (" + an.Reason + ")"
			}
		},
		Approval: a.approval, Cancel: a.cancel, RunEnded: a.runEnded, Undecodable: a.undecodable,
		Timer: func(_ runlog.StoredEvent, t events.RunTimer) {
			a.e.Summary = "the run ends at " + t.Deadline.UTC().Format(time.RFC3339) + " if it still goes on then"
		},
		Other: func(ev runlog.StoredEvent) { a.e.Summary = "unknown event type " + ev.Meta.Type },
	}
	for _, ev := range evs {
		e := TimelineEntry{Seq: ev.Seq, Step: ev.Meta.Step, Source: ev.Meta.Source, Type: strings.TrimPrefix(ev.Meta.Type, "toolbus.")}
		if !a.startTime.IsZero() {
			e.AtMS = ev.Time.Sub(a.startTime).Milliseconds()
		}
		if a.terminal != nil {
			e.AfterEnd = true
		}
		a.e = &e
		v.Visit(ev)
		a.r.Timeline = append(a.r.Timeline, e)
	}
	a.finish()
	return a.r
}

func (a *analysis) addV(code string, seq uint64, step int, callID, format string, args ...any) {
	a.r.Violations = append(a.r.Violations, Violation{Code: code, Seq: seq, Step: step, CallID: callID, Message: fmt.Sprintf(format, args...)})
}

func (a *analysis) stepOf(n int) *stepState {
	s := a.steps[n]
	if s == nil {
		s = &stepState{calls: map[string]*Call{}}
		a.steps[n] = s
	}
	return s
}

func (a *analysis) findCall(step int, callID string) *Call {
	if st := a.steps[step]; st != nil {
		return st.calls[callID]
	}
	return nil
}

// transcriptUpTo builds the messages the model is sent at step n, from the events.
func (a *analysis) transcriptUpTo(n int) []toolbus.Message {
	if a.started == nil {
		return nil
	}
	msgs := append([]toolbus.Message(nil), a.started.Messages...)
	for s := 0; s < n; s++ {
		st := a.steps[s]
		if st == nil || st.responded == nil {
			break
		}
		msgs = append(msgs, st.responded.Message)
		for _, c := range st.responded.Message.ToolCalls {
			if rc := st.calls[c.CallID]; rc != nil && rc.Result != nil {
				msgs = append(msgs, toolbus.ToolMessage(*rc.Result))
			}
		}
	}
	return msgs
}

func (a *analysis) undecodable(ev runlog.StoredEvent, err error) {
	e := a.e
	if errors.Is(ev.Err, events.ErrSubjectMismatch) {
		e.Summary = "ignored: " + ev.Err.Error()
		a.addV(ViolationSubjectMismatch, ev.Seq, ev.Meta.Step, ev.Meta.CallID, "%s #%d on %s: %v", ev.Meta.Type, ev.Seq, ev.Subject, ev.Err)
		return
	}
	if ev.Err != nil {
		e.Type = "undecodable"
		e.Summary = "undecodable message on " + ev.Subject + ": " + ev.Err.Error()
		a.addV(ViolationUndecodable, ev.Seq, 0, "", "message #%d on %s is not a toolbus event: %s", ev.Seq, ev.Subject, ev.Err)
		return
	}
	a.addV(ViolationUndecodable, ev.Seq, ev.Meta.Step, "", "%s #%d: data does not decode: %v", ev.Meta.Type, ev.Seq, err)
}

func (a *analysis) runStarted(ev runlog.StoredEvent, rs toolbus.RunStarted) {
	e := a.e
	e.Step = 0
	if a.started != nil {
		a.addV(ViolationTerminal, ev.Seq, 0, "", "a second run.started (#%d)", ev.Seq)
		return
	}
	a.started, a.startTime = &rs, ev.Time
	a.r.Model, a.r.Principal, a.r.Limits, a.r.StartedAt = rs.Model, rs.Principal.ID, rs.Limits, ev.Time
	e.Summary = fmt.Sprintf("run started (model %s, principal %s)", orDash(ModelName(rs.Model)), orDash(rs.Principal.ID))
	for _, m := range rs.Messages {
		e.Details = append(e.Details, fmt.Sprintf("%s: %s", m.Role, OneLine(m.Content, 100)))
	}
	if len(rs.AllowedTools) > 0 {
		e.Details = append(e.Details, "allowed tools: "+strings.Join(rs.AllowedTools, ", "))
	}
	if l := limitsText(rs.Limits); l != "" {
		e.Details = append(e.Details, "limits: "+l)
	}
}

func (a *analysis) modelRequested(ev runlog.StoredEvent, mr toolbus.ModelRequested) {
	e := a.e
	e.Step = mr.Step
	if a.terminal != nil {
		a.addV(ViolationTerminal, ev.Seq, mr.Step, "", "step %d requested after the run ended %s (#%d)", mr.Step, a.terminal.Status, a.terminal.Seq)
	}
	st := a.stepOf(mr.Step)
	if st.requestedSeq != 0 {
		a.addV(ViolationStepOrder, ev.Seq, mr.Step, "", "step %d requested twice (#%d and #%d)", mr.Step, st.requestedSeq, ev.Seq)
	} else if mr.Step != a.lastStep+1 {
		a.addV(ViolationStepOrder, ev.Seq, mr.Step, "", "step %d requested after step %d", mr.Step, a.lastStep)
	}
	st.requestedSeq = ev.Seq
	if mr.Step > a.lastStep {
		a.lastStep = mr.Step
	}
	// The step's history needs every result of the step before it.
	if prev := a.steps[mr.Step-1]; mr.Step > 0 && prev != nil {
		if prev.responded == nil {
			a.addV(ViolationStepOrder, ev.Seq, mr.Step, "", "step %d requested before step %d was answered", mr.Step, mr.Step-1)
		} else {
			if len(prev.responded.Message.ToolCalls) == 0 {
				a.addV(ViolationStepOrder, ev.Seq, mr.Step, "", "step %d requested although the model answered step %d without calls", mr.Step, mr.Step-1)
			}
			for _, c := range prev.responded.Message.ToolCalls {
				if rc := prev.calls[c.CallID]; rc == nil || rc.Result == nil {
					a.addV(ViolationStepOrder, ev.Seq, mr.Step, c.CallID, "step %d requested before the result of call %s of step %d", mr.Step, c.CallID, mr.Step-1)
				}
			}
		}
	}
	msgs := a.transcriptUpTo(mr.Step)
	a.r.Requests = append(a.r.Requests, ModelRequest{Step: mr.Step, Seq: ev.Seq, Messages: len(msgs)})
	e.Summary = fmt.Sprintf("model requested with %d message(s)", len(msgs))
	if mr.Step > 0 {
		if prev := a.steps[mr.Step-1]; prev != nil && prev.responded != nil && len(prev.responded.Message.ToolCalls) > 0 {
			e.Summary += "; the model then saw:"
			for _, c := range prev.responded.Message.ToolCalls {
				if rc := prev.calls[c.CallID]; rc != nil && rc.Result != nil {
					e.Details = append(e.Details, ToolMessageText(toolbus.ToolMessage(*rc.Result)))
				}
			}
		}
	}
}

func (a *analysis) modelResponded(ev runlog.StoredEvent, mr toolbus.ModelResponded) {
	e := a.e
	e.Step = mr.Step
	st := a.stepOf(mr.Step)
	if st.responded != nil {
		a.addV(ViolationStepOrder, ev.Seq, mr.Step, "", "step %d answered twice", mr.Step)
		return
	}
	if st.requestedSeq == 0 {
		a.addV(ViolationStepOrder, ev.Seq, mr.Step, "", "step %d answered but never requested", mr.Step)
	}
	st.responded = &mr
	if a.r.Model == "" {
		a.r.Model = mr.Model
	}
	a.r.Usage = a.r.Usage.Add(mr.Usage)
	e.DurationMS = mr.LatencyMS
	calls := mr.Message.ToolCalls
	switch len(calls) {
	case 0:
		e.Summary = fmt.Sprintf("model answered in %d ms (%d tokens)", mr.LatencyMS, mr.Usage.Total())
	default:
		e.Summary = fmt.Sprintf("model asked for %d call(s) in %d ms (%d tokens)", len(calls), mr.LatencyMS, mr.Usage.Total())
	}
	if t := OneLine(mr.Message.Content, 100); t != "" {
		e.Summary += ": " + t
	}
	for i, c := range calls {
		st.calls[c.CallID] = &Call{Step: mr.Step, Index: i, CallID: c.CallID, Tool: c.Tool, Arguments: c.Arguments}
		a.order = append(a.order, callKey{mr.Step, c.CallID})
		e.Details = append(e.Details, fmt.Sprintf("-> %s %s(%s)", c.CallID, c.Tool, OneLine(c.Arguments, 80)))
	}
}

func (a *analysis) toolRequested(ev runlog.StoredEvent, tr toolbus.ToolRequested) {
	e := a.e
	e.Step, e.CallID, e.Tool = tr.Step, tr.Call.CallID, tr.Call.Tool
	rc := a.findCall(tr.Step, tr.Call.CallID)
	if rc == nil {
		a.addV(ViolationUnknownCall, ev.Seq, tr.Step, tr.Call.CallID, "call %s requested, but the model did not ask for it at step %d", tr.Call.CallID, tr.Step)
		e.Summary = "requested (unknown call)"
		return
	}
	if tr.CallIndex != rc.Index {
		a.addV(ViolationCallOrder, ev.Seq, tr.Step, tr.Call.CallID, "call %s requested with index %d, but it is call %d of the step", tr.Call.CallID, tr.CallIndex, rc.Index)
	}
	rc.Requested++
	e.Summary = "requested"
	if tr.Approved {
		e.Summary = "requested again after the decision"
	}
}

func (a *analysis) toolWaiting(_ runlog.StoredEvent, tw toolbus.ToolWaiting) {
	e := a.e
	e.Step, e.CallID, e.Tool = tw.Step, tw.Call.CallID, tw.Call.Tool
	e.Summary = "waits for approval (not run)"
	if rc := a.findCall(tw.Step, tw.Call.CallID); rc != nil {
		rc.Waited = true
	}
}

func (a *analysis) toolProgress(ev runlog.StoredEvent, tp toolbus.ToolProgress) {
	e := a.e
	e.Step, e.CallID, e.Tool = tp.Step, tp.CallID, tp.Tool
	e.Summary = ProgressText(tp)
	rc := a.findCall(tp.Step, tp.CallID)
	if rc == nil || rc.Requested == 0 || rc.Results > 0 || rc.Tool != tp.Tool {
		e.Summary = "ignored: progress for a call that is not running (" + e.Summary + ")"
		a.addV(ViolationProgressNotRunning, ev.Seq, tp.Step, tp.CallID, "tool.progress %d of call %s when the call was not running (no request before it, or after its result) or of another tool (%s)", tp.Seq, tp.CallID, tp.Tool)
		return
	}
	if rc.Progress == nil || tp.Attempt > rc.Progress.Attempt || (tp.Attempt == rc.Progress.Attempt && tp.Seq > rc.Progress.Seq) {
		rc.Progress = &tp
	}
}

// ProgressText says how far a call has come: "40/120 (33%): searched 40 archives",
// "40: ..." when the total is unknown.
func ProgressText(tp toolbus.ToolProgress) string {
	s := strconv.FormatFloat(tp.Done, 'f', -1, 64)
	if tp.Total > 0 {
		s += "/" + strconv.FormatFloat(tp.Total, 'f', -1, 64) + fmt.Sprintf(" (%d%%)", int(100*tp.Done/tp.Total))
	}
	if tp.Message != "" {
		s += ": " + OneLine(tp.Message, 100)
	}
	return "progress " + s
}

func (a *analysis) approval(_ runlog.StoredEvent, ap toolbus.Approval, granted bool) {
	e := a.e
	e.CallID = ap.CallID
	verb := "granted"
	if !granted {
		verb = "denied"
	}
	e.Summary = fmt.Sprintf("approval %s by %s", verb, orDash(ap.Who))
	switch kind := ap.Kind(granted); kind {
	case toolbus.DecisionEdited:
		e.Summary = fmt.Sprintf("approval granted with edited arguments %s by %s", OneLine(ap.Arguments, 100), orDash(ap.Who))
	case toolbus.DecisionResponded:
		e.Summary = fmt.Sprintf("answered in the tool's place by %s: %s", orDash(ap.Who), OneLine(ap.Response, 100))
	}
	if ap.Why != "" {
		e.Summary += ": " + OneLine(ap.Why, 100)
	}
	rc := a.findCall(e.Step, ap.CallID)
	if rc == nil && e.Step != a.lastStep { // a publisher that did not set the step
		if rc = a.findCall(a.lastStep, ap.CallID); rc != nil {
			e.Step = a.lastStep
		}
	}
	if rc != nil {
		e.Tool = rc.Tool
		a.decisions[callKey{e.Step, ap.CallID}] = append(a.decisions[callKey{e.Step, ap.CallID}], decisionEvent{ap, granted})
		if rc.Decision == "" {
			decide(rc, ap, granted)
		}
	}
}

// decide records ap as the decision on rc.
func decide(rc *Call, ap toolbus.Approval, granted bool) {
	rc.Decision = "granted"
	if !granted {
		rc.Decision = "denied"
	}
	rc.DecidedBy, rc.DecidedWhy = ap.Who, ap.Why
	rc.DecisionKind, rc.EditedArguments, rc.Response = ap.Kind(granted), ap.Arguments, ap.Response
}

// standingDecision makes the decision a result names (Human) the call's decision: the
// first approval event by that person of that kind. Until the result, the first
// approval event stands in the report; a decision the injector refused (its policy, a
// bad edit) comes first in the stream but is not the one the call ran under.
func (a *analysis) standingDecision(rc *Call, step int, h *toolbus.HumanDecision) {
	if h == nil || (rc.DecidedBy == h.Who && rc.DecisionKind == h.Kind) {
		return
	}
	for _, d := range a.decisions[callKey{step, rc.CallID}] {
		if d.ap.Who == h.Who && d.ap.Kind(d.granted) == h.Kind {
			decide(rc, d.ap, d.granted)
			return
		}
	}
}

func (a *analysis) toolFinished(ev runlog.StoredEvent, tf toolbus.ToolFinished) {
	e := a.e
	res := tf.ToolResult
	e.Step, e.CallID, e.Tool = tf.Step, res.CallID, res.Tool
	e.Status, e.Code, e.DurationMS, e.Executor = string(res.Status), res.Code(), res.DurationMS, res.Executor
	e.Summary = fmt.Sprintf("%s in %d ms on %s", res.Status, res.DurationMS, orDash(res.Executor))
	if res.Error != nil {
		code := " " + res.Error.Code
		if res.Error.Code == string(res.Status) {
			code = ""
		}
		e.Summary = fmt.Sprintf("%s%s (%s) in %d ms on %s", res.Status, code, OneLine(res.Error.Message, 80), res.DurationMS, orDash(res.Executor))
	}
	if len(res.Retries) > 0 {
		parts := make([]string, len(res.Retries))
		for i, fa := range res.Retries {
			parts[i] = fmt.Sprintf("#%d %s on %s, retried after %d ms", fa.Attempt, fa.Error.Code, orDash(fa.Executor), fa.RetryAfterMS)
		}
		e.Summary += ", after failed attempts retried by the tool's policy: " + strings.Join(parts, "; ")
	}
	if res.Human != nil {
		e.Summary += fmt.Sprintf(" (%s by %s)", res.Human.Kind, orDash(res.Human.Who))
	}
	if res.Attempt > 1 {
		e.Summary += fmt.Sprintf(", attempt %d", res.Attempt)
	}
	if res.Truncated != nil {
		e.Details = append(e.Details, fmt.Sprintf("content truncated %d -> %d bytes", res.Truncated.OriginalBytes, res.Truncated.KeptBytes))
	}
	rc := a.findCall(tf.Step, res.CallID)
	if rc != nil && rc.Tool != res.Tool {
		// Another tool's result naming the call (its team writes its own tool's result
		// subject): the call's result it is not, as the injector does not join it.
		a.addV(ViolationOrphanResult, ev.Seq, tf.Step, res.CallID, "result of call %s at step %d is tool %s's, but the call is of tool %s", res.CallID, tf.Step, res.Tool, rc.Tool)
		e.Summary += " (another tool's, ignored)"
		return
	}
	if rc == nil || rc.Requested == 0 {
		a.addV(ViolationOrphanResult, ev.Seq, tf.Step, res.CallID, "result of call %s at step %d has no request before it", res.CallID, tf.Step)
		if rc == nil {
			return
		}
	}
	if tf.CallIndex != rc.Index {
		a.addV(ViolationCallOrder, ev.Seq, tf.Step, res.CallID, "result of call %s carries index %d, but it is call %d of the step", res.CallID, tf.CallIndex, rc.Index)
	}
	if prev := rc.Result; prev != nil && prev.Attempt > 0 && res.Attempt > 0 && prev.Attempt != res.Attempt {
		// Two executor attempts at the call: the earlier one was cut off from the bus and
		// its publication arrived late. The result of the later attempt stands (the
		// injector holds the late one back while the later attempt owns the call).
		if res.Attempt < prev.Attempt {
			e.Summary += fmt.Sprintf(" (late result of attempt %d, superseded by attempt %d: ignored)", res.Attempt, prev.Attempt)
			return
		}
		e.Summary += fmt.Sprintf(" (supersedes the late result of attempt %d)", prev.Attempt)
		res.Output = nil
		rc.Result = &res
		return
	}
	rc.Results++
	if rc.Results > 1 {
		a.addV(ViolationDuplicateResult, ev.Seq, tf.Step, res.CallID, "call %s of step %d has %d results; the first stands", res.CallID, tf.Step, rc.Results)
		e.Summary += " (duplicate, ignored)"
		return
	}
	res.Output = nil // the model reads Content; Output stays in the stream
	rc.Result = &res
	a.standingDecision(rc, tf.Step, res.Human)
}

func (a *analysis) cancel(_ runlog.StoredEvent, c toolbus.Cancel) {
	e := a.e
	e.Summary = "cancel requested"
	if c.Who != "" {
		e.Summary += " by " + c.Who
	}
	if c.Reason != "" {
		e.Summary += ": " + OneLine(c.Reason, 100)
	}
}

func (a *analysis) runEnded(ev runlog.StoredEvent, re toolbus.RunEnded) {
	e := a.e
	e.Status, e.Code = string(re.Status), re.Code
	e.Summary = fmt.Sprintf("run %s after %d step(s), %d tokens", re.Status, re.StepsUsed, re.Usage.Total())
	if re.Code != "" {
		e.Summary += " [" + re.Code + "]"
	}
	if re.Reason != "" {
		e.Details = append(e.Details, "reason: "+OneLine(re.Reason, 120))
	}
	for _, c := range re.Pending {
		e.Details = append(e.Details, fmt.Sprintf("pending: %s %s(%s)", c.CallID, c.Tool, OneLine(c.Arguments, 80)))
	}
	if re.Answer != "" {
		e.Details = append(e.Details, "answer: "+OneLine(re.Answer, 200))
	}
	if a.terminal != nil {
		a.addV(ViolationTerminal, ev.Seq, e.Step, "", "outcome %s (#%d) after the run ended %s (#%d)", re.Status, ev.Seq, a.terminal.Status, a.terminal.Seq)
		return
	}
	r := a.r
	r.Status, r.Code, r.Reason, r.Answer, r.Pending = re.Status, re.Code, re.Reason, re.Answer, re.Pending
	r.DurationMS = e.AtMS
	if re.Status.Terminal() {
		cp := *e
		a.terminal = &cp
	}
	if re.Status == toolbus.RunCompleted {
		st := a.steps[e.Step]
		switch {
		case st == nil || st.responded == nil:
			a.addV(ViolationTerminal, ev.Seq, e.Step, "", "run completed at step %d, which the model never answered", e.Step)
		case len(st.responded.Message.ToolCalls) > 0:
			a.addV(ViolationTerminal, ev.Seq, e.Step, "", "run completed at step %d, whose answer asks for calls", e.Step)
		case st.responded.Message.Content != re.Answer:
			a.addV(ViolationTerminal, ev.Seq, e.Step, "", "the completed answer is not the model's last message")
		}
	}
}

// finish checks what the whole run shows: results and requests missing, the
// transcript, the order of the violations.
func (a *analysis) finish() {
	r := a.r
	if a.started == nil {
		a.addV(ViolationNoRunStarted, 0, 0, "", "no run.started event for run %s", r.RunID)
	}
	// A request without a result is allowed only where the run stopped: it waits for a
	// decision, it was cancelled, or it is still under way (the last step).
	stopped := r.Status == toolbus.RunCancelled || r.Status == toolbus.RunWaitingForApproval || r.Status == toolbus.RunRunning
	for _, k := range a.order {
		rc := a.steps[k.step].calls[k.id]
		r.Calls = append(r.Calls, *rc)
		lastOfRun := k.step == a.lastStep
		switch {
		case rc.Result != nil:
		case rc.Requested > 0 && !(stopped && lastOfRun):
			a.addV(ViolationMissingResult, 0, k.step, k.id, "call %s of step %d was requested but has no result (run %s)", k.id, k.step, r.Status)
		case rc.Requested == 0 && !lastOfRun:
			a.addV(ViolationMissingRequest, 0, k.step, k.id, "call %s of step %d was never requested, yet the run went on", k.id, k.step)
		}
	}
	for _, st := range a.steps {
		if st.responded != nil {
			r.Steps++
		}
	}
	// The transcript: everything the model was sent, then its last answer (results that
	// came after it were never sent).
	r.Transcript = a.transcriptUpTo(a.lastStep)
	if st := a.steps[a.lastStep]; st != nil && st.responded != nil && a.started != nil {
		r.Transcript = append(r.Transcript, st.responded.Message)
	}
	if r.Transcript == nil {
		r.Transcript = []toolbus.Message{}
	}
	sort.SliceStable(r.Violations, func(i, j int) bool {
		a, b := r.Violations[i], r.Violations[j]
		if (a.Seq == 0) != (b.Seq == 0) {
			return a.Seq != 0
		}
		return a.Seq < b.Seq
	})
	r.OK = len(r.Violations) == 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func limitsText(l toolbus.Limits) string {
	var parts []string
	if l.MaxSteps > 0 {
		parts = append(parts, "max_steps "+strconv.Itoa(l.MaxSteps))
	}
	if !l.Deadline.IsZero() {
		parts = append(parts, "deadline "+l.Deadline.UTC().Format(time.RFC3339))
	}
	if l.TokenBudget > 0 {
		parts = append(parts, "token_budget "+strconv.FormatInt(l.TokenBudget, 10))
	}
	if l.CallTimeout > 0 {
		parts = append(parts, "call_timeout "+l.CallTimeout.String())
	}
	return strings.Join(parts, ", ")
}

// ToolMessageText renders a tool message on one line: call id, tool, error flag, the
// start of its content.
func ToolMessageText(m toolbus.Message) string {
	flag := ""
	if m.IsError {
		flag = " [error]"
	}
	return fmt.Sprintf("tool %s %s%s: %s", m.ToolCallID, m.Name, flag, OneLine(m.Content, 100))
}

// OneLine folds s onto one line (runs of white space become one space) and cuts it to
// at most n bytes, on a rune boundary, marking the cut with "...".
func OneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		cut := n
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

// ModelName names the model a run asked for, for people: a script the run carries
// (script:{...}, up to 64 KiB shipped by its client) is named by its size, not printed
// whole.
func ModelName(model string) string {
	if script, ok := strings.CutPrefix(model, "script:{"); ok {
		return fmt.Sprintf("a script shipped with the run (%d bytes)", len(script)+1)
	}
	return model
}
