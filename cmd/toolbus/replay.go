package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// `toolbus replay <run>` is the auditor's view of a run: it reads the run's events from
// the stream in order (nothing is executed, no store but the stream is read), prints the
// timeline, rebuilds the transcript the model was sent and checks the invariants of the
// contract. The analysis (analyzeRun) is a pure function of the events.

// auditEvent is one stored event of a run.
type auditEvent struct {
	Seq     uint64
	Subject string
	// Time is when the stream stored the event.
	Time time.Time
	Meta events.Meta
	// Data is the event's data (JSON).
	Data json.RawMessage
	// Err is set when the message is not a decodable toolbus event.
	Err string
}

// Violation codes of the replay report.
const (
	vNoRunStarted    = "no_run_started"    // the run's events have no run.started
	vUndecodable     = "undecodable_event" // a message on the run's subjects is not a toolbus event
	vDuplicateResult = "duplicate_result"  // more than one tool.finished for one call (step + call_id)
	vOrphanResult    = "orphan_result"     // a tool.finished with no tool.requested before it
	vMissingResult   = "missing_result"    // a tool.requested that never got its result
	vMissingRequest  = "missing_request"   // a call the model asked for was never requested, yet the run went on
	vCallOrder       = "call_order"        // a request or result whose call_index is not the call's position
	vUnknownCall     = "unknown_call"      // a request for a call the model did not ask for
	vStepOrder       = "step_order"        // a step requested out of order or before the results it needs
	vTerminal        = "terminal_state"    // not exactly one terminal outcome, last
)

// violation is one broken invariant.
type violation struct {
	Code    string `json:"code"`
	Seq     uint64 `json:"seq,omitempty"`
	Step    int    `json:"step"`
	CallID  string `json:"call_id,omitempty"`
	Message string `json:"message"`
}

// timelineEntry is one event of the timeline, in stream order.
type timelineEntry struct {
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

// modelRequest says how much of the transcript the model was sent at a step.
type modelRequest struct {
	Step     int    `json:"step"`
	Seq      uint64 `json:"seq"`
	Messages int    `json:"messages"`
}

// replayCall is the audit of one call.
type replayCall struct {
	Step      int                 `json:"step"`
	Index     int                 `json:"index"`
	CallID    string              `json:"call_id"`
	Tool      string              `json:"tool"`
	Arguments string              `json:"arguments"`
	Requested int                 `json:"requested"`
	Waited    bool                `json:"waited,omitempty"`
	Decision  string              `json:"decision,omitempty"`
	DecidedBy string              `json:"decided_by,omitempty"`
	Results   int                 `json:"results"`
	Result    *toolbus.ToolResult `json:"result,omitempty"`
}

// replayReport is the output of replay (--json prints it as is).
type replayReport struct {
	RunID      string             `json:"run_id"`
	Status     toolbus.RunStatus  `json:"status"`
	Code       string             `json:"code,omitempty"`
	Reason     string             `json:"reason,omitempty"`
	Answer     string             `json:"answer,omitempty"`
	Pending    []toolbus.ToolCall `json:"pending,omitempty"`
	Model      string             `json:"model,omitempty"`
	Principal  string             `json:"principal,omitempty"`
	Limits     toolbus.Limits     `json:"limits"`
	StartedAt  time.Time          `json:"started_at,omitzero"`
	DurationMS int64              `json:"duration_ms"`
	Steps      int                `json:"steps"`
	Usage      toolbus.Usage      `json:"usage"`
	Events     int                `json:"events"`
	Timeline   []timelineEntry    `json:"timeline"`
	Calls      []replayCall       `json:"calls"`
	// Transcript is the conversation as the model was sent it: the run's input
	// messages, then per step the assistant message whole and its tool messages in call
	// order; the last message is the model's last answer. Requests say how many of
	// these messages each step's request carried.
	Transcript []toolbus.Message `json:"transcript"`
	Requests   []modelRequest    `json:"model_requests"`
	Violations []violation       `json:"violations"`
	OK         bool              `json:"ok"`
}

type callKey struct {
	step int
	id   string
}

// stepState is what analyzeRun knows of one step while it reads the events.
type stepState struct {
	requestedSeq uint64
	responded    *toolbus.ModelResponded
	calls        map[string]*replayCall
}

// analyzeRun audits the events of one run, given in stream order. It reads no store and
// no clock: the same events give the same report.
func analyzeRun(run string, evs []auditEvent) *replayReport {
	r := &replayReport{RunID: run, Status: toolbus.RunRunning, Events: len(evs), Timeline: []timelineEntry{},
		Calls: []replayCall{}, Transcript: []toolbus.Message{}, Requests: []modelRequest{}, Violations: []violation{}}
	var (
		started   *toolbus.RunStarted
		startTime time.Time
		steps     = map[int]*stepState{}
		lastStep  = -1 // highest step requested
		terminal  *timelineEntry
		order     []callKey // calls in the order the model asked for them
	)
	addV := func(code string, seq uint64, step int, callID, format string, args ...any) {
		r.Violations = append(r.Violations, violation{Code: code, Seq: seq, Step: step, CallID: callID, Message: fmt.Sprintf(format, args...)})
	}
	stepOf := func(n int) *stepState {
		s := steps[n]
		if s == nil {
			s = &stepState{calls: map[string]*replayCall{}}
			steps[n] = s
		}
		return s
	}
	// transcriptUpTo builds the messages the model is sent at step n, from the events.
	transcriptUpTo := func(n int) []toolbus.Message {
		if started == nil {
			return nil
		}
		msgs := append([]toolbus.Message(nil), started.Messages...)
		for s := 0; s < n; s++ {
			st := steps[s]
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

	for i := range evs {
		ev := &evs[i]
		e := timelineEntry{Seq: ev.Seq, Step: ev.Meta.Step, Source: ev.Meta.Source, Type: strings.TrimPrefix(ev.Meta.Type, "toolbus.")}
		if !startTime.IsZero() {
			e.AtMS = ev.Time.Sub(startTime).Milliseconds()
		}
		if terminal != nil {
			e.AfterEnd = true
		}
		if ev.Err != "" {
			e.Type = "undecodable"
			e.Summary = "undecodable message on " + ev.Subject + ": " + ev.Err
			addV(vUndecodable, ev.Seq, 0, "", "message #%d on %s is not a toolbus event: %s", ev.Seq, ev.Subject, ev.Err)
			r.Timeline = append(r.Timeline, e)
			continue
		}
		decode := func(v any) bool {
			if err := json.Unmarshal(ev.Data, v); err != nil {
				addV(vUndecodable, ev.Seq, ev.Meta.Step, "", "%s #%d: data does not decode: %v", ev.Meta.Type, ev.Seq, err)
				return false
			}
			return true
		}
		switch typ := ev.Meta.Type; {
		case typ == events.TypeRunStarted:
			var rs toolbus.RunStarted
			if !decode(&rs) {
				break
			}
			e.Step = 0
			if started != nil {
				addV(vTerminal, ev.Seq, 0, "", "a second run.started (#%d)", ev.Seq)
				break
			}
			started, startTime = &rs, ev.Time
			r.Model, r.Principal, r.Limits, r.StartedAt = rs.Model, rs.Principal.ID, rs.Limits, ev.Time
			e.Summary = fmt.Sprintf("run started (model %s, principal %s)", orDash(rs.Model), orDash(rs.Principal.ID))
			for _, m := range rs.Messages {
				e.Details = append(e.Details, fmt.Sprintf("%s: %s", m.Role, oneLine(m.Content, 100)))
			}
			if len(rs.AllowedTools) > 0 {
				e.Details = append(e.Details, "allowed tools: "+strings.Join(rs.AllowedTools, ", "))
			}
			if l := limitsText(rs.Limits); l != "" {
				e.Details = append(e.Details, "limits: "+l)
			}

		case typ == events.TypeModelRequested:
			var mr toolbus.ModelRequested
			if !decode(&mr) {
				break
			}
			e.Step = mr.Step
			if terminal != nil {
				addV(vTerminal, ev.Seq, mr.Step, "", "step %d requested after the run ended %s (#%d)", mr.Step, terminal.Status, terminal.Seq)
			}
			st := stepOf(mr.Step)
			if st.requestedSeq != 0 {
				addV(vStepOrder, ev.Seq, mr.Step, "", "step %d requested twice (#%d and #%d)", mr.Step, st.requestedSeq, ev.Seq)
			} else if mr.Step != lastStep+1 {
				addV(vStepOrder, ev.Seq, mr.Step, "", "step %d requested after step %d", mr.Step, lastStep)
			}
			st.requestedSeq = ev.Seq
			if mr.Step > lastStep {
				lastStep = mr.Step
			}
			// The step's history needs every result of the step before it.
			if prev := steps[mr.Step-1]; mr.Step > 0 && prev != nil {
				if prev.responded == nil {
					addV(vStepOrder, ev.Seq, mr.Step, "", "step %d requested before step %d was answered", mr.Step, mr.Step-1)
				} else {
					if len(prev.responded.Message.ToolCalls) == 0 {
						addV(vStepOrder, ev.Seq, mr.Step, "", "step %d requested although the model answered step %d without calls", mr.Step, mr.Step-1)
					}
					for _, c := range prev.responded.Message.ToolCalls {
						if rc := prev.calls[c.CallID]; rc == nil || rc.Result == nil {
							addV(vStepOrder, ev.Seq, mr.Step, c.CallID, "step %d requested before the result of call %s of step %d", mr.Step, c.CallID, mr.Step-1)
						}
					}
				}
			}
			msgs := transcriptUpTo(mr.Step)
			r.Requests = append(r.Requests, modelRequest{Step: mr.Step, Seq: ev.Seq, Messages: len(msgs)})
			e.Summary = fmt.Sprintf("model requested with %d message(s)", len(msgs))
			if mr.Step > 0 {
				if prev := steps[mr.Step-1]; prev != nil && prev.responded != nil && len(prev.responded.Message.ToolCalls) > 0 {
					e.Summary += "; the model then saw:"
					for _, c := range prev.responded.Message.ToolCalls {
						if rc := prev.calls[c.CallID]; rc != nil && rc.Result != nil {
							e.Details = append(e.Details, toolMessageText(toolbus.ToolMessage(*rc.Result)))
						}
					}
				}
			}

		case typ == events.TypeModelResponded:
			var mr toolbus.ModelResponded
			if !decode(&mr) {
				break
			}
			e.Step = mr.Step
			st := stepOf(mr.Step)
			if st.responded != nil {
				addV(vStepOrder, ev.Seq, mr.Step, "", "step %d answered twice", mr.Step)
				break
			}
			if st.requestedSeq == 0 {
				addV(vStepOrder, ev.Seq, mr.Step, "", "step %d answered but never requested", mr.Step)
			}
			st.responded = &mr
			r.Usage = r.Usage.Add(mr.Usage)
			e.DurationMS = mr.LatencyMS
			calls := mr.Message.ToolCalls
			switch len(calls) {
			case 0:
				e.Summary = fmt.Sprintf("model answered in %d ms (%d tokens)", mr.LatencyMS, mr.Usage.Total())
			default:
				e.Summary = fmt.Sprintf("model asked for %d call(s) in %d ms (%d tokens)", len(calls), mr.LatencyMS, mr.Usage.Total())
			}
			if t := oneLine(mr.Message.Content, 100); t != "" {
				e.Summary += ": " + t
			}
			for i, c := range calls {
				st.calls[c.CallID] = &replayCall{Step: mr.Step, Index: i, CallID: c.CallID, Tool: c.Tool, Arguments: c.Arguments}
				order = append(order, callKey{mr.Step, c.CallID})
				e.Details = append(e.Details, fmt.Sprintf("-> %s %s(%s)", c.CallID, c.Tool, oneLine(c.Arguments, 80)))
			}

		case typ == events.TypeToolRequested:
			var tr toolbus.ToolRequested
			if !decode(&tr) {
				break
			}
			e.Step, e.CallID, e.Tool = tr.Step, tr.Call.CallID, tr.Call.Tool
			rc := findCall(steps, tr.Step, tr.Call.CallID)
			if rc == nil {
				addV(vUnknownCall, ev.Seq, tr.Step, tr.Call.CallID, "call %s requested, but the model did not ask for it at step %d", tr.Call.CallID, tr.Step)
				e.Summary = "requested (unknown call)"
				break
			}
			if tr.CallIndex != rc.Index {
				addV(vCallOrder, ev.Seq, tr.Step, tr.Call.CallID, "call %s requested with index %d, but it is call %d of the step", tr.Call.CallID, tr.CallIndex, rc.Index)
			}
			rc.Requested++
			e.Summary = "requested"
			if tr.Approved {
				e.Summary = "requested again after the decision"
			}

		case typ == events.TypeToolWaiting:
			var tw toolbus.ToolWaiting
			if !decode(&tw) {
				break
			}
			e.Step, e.CallID, e.Tool = tw.Step, tw.Call.CallID, tw.Call.Tool
			e.Summary = "waits for approval (not run)"
			if rc := findCall(steps, tw.Step, tw.Call.CallID); rc != nil {
				rc.Waited = true
			}

		case typ == events.TypeApprovalGranted || typ == events.TypeApprovalDenied:
			var a toolbus.Approval
			if !decode(&a) {
				break
			}
			e.CallID = a.CallID
			verb := "granted"
			if typ == events.TypeApprovalDenied {
				verb = "denied"
			}
			e.Summary = fmt.Sprintf("approval %s by %s", verb, orDash(a.Who))
			if a.Why != "" {
				e.Summary += ": " + oneLine(a.Why, 100)
			}
			rc := findCall(steps, e.Step, a.CallID)
			if rc == nil && e.Step != lastStep { // a publisher that did not set the step
				if rc = findCall(steps, lastStep, a.CallID); rc != nil {
					e.Step = lastStep
				}
			}
			if rc != nil {
				e.Tool = rc.Tool
				if rc.Decision == "" {
					rc.Decision, rc.DecidedBy = verb, a.Who
				}
			}

		case typ == events.TypeToolFinished:
			var tf toolbus.ToolFinished
			if !decode(&tf) {
				break
			}
			res := tf.ToolResult
			e.Step, e.CallID, e.Tool = tf.Step, res.CallID, res.Tool
			e.Status, e.Code, e.DurationMS, e.Executor = string(res.Status), res.Code(), res.DurationMS, res.Executor
			e.Summary = fmt.Sprintf("%s in %d ms on %s", res.Status, res.DurationMS, orDash(res.Executor))
			if res.Error != nil {
				code := " " + res.Error.Code
				if res.Error.Code == string(res.Status) {
					code = ""
				}
				e.Summary = fmt.Sprintf("%s%s (%s) in %d ms on %s", res.Status, code, oneLine(res.Error.Message, 80), res.DurationMS, orDash(res.Executor))
			}
			if res.Attempt > 1 {
				e.Summary += fmt.Sprintf(", attempt %d", res.Attempt)
			}
			if res.Truncated != nil {
				e.Details = append(e.Details, fmt.Sprintf("content truncated %d -> %d bytes", res.Truncated.OriginalBytes, res.Truncated.KeptBytes))
			}
			rc := findCall(steps, tf.Step, res.CallID)
			if rc == nil || rc.Requested == 0 {
				addV(vOrphanResult, ev.Seq, tf.Step, res.CallID, "result of call %s at step %d has no request before it", res.CallID, tf.Step)
				if rc == nil {
					break
				}
			}
			if tf.CallIndex != rc.Index {
				addV(vCallOrder, ev.Seq, tf.Step, res.CallID, "result of call %s carries index %d, but it is call %d of the step", res.CallID, tf.CallIndex, rc.Index)
			}
			rc.Results++
			if rc.Results > 1 {
				addV(vDuplicateResult, ev.Seq, tf.Step, res.CallID, "call %s of step %d has %d results; the first stands", res.CallID, tf.Step, rc.Results)
				e.Summary += " (duplicate, ignored)"
				break
			}
			res.Output = nil // the model reads Content; Output stays in the stream
			rc.Result = &res

		case typ == events.TypeRunCancel:
			var c toolbus.Cancel
			if !decode(&c) {
				break
			}
			e.Summary = "cancel requested"
			if c.Who != "" {
				e.Summary += " by " + c.Who
			}
			if c.Reason != "" {
				e.Summary += ": " + oneLine(c.Reason, 100)
			}

		case strings.HasPrefix(typ, "toolbus.run."):
			var re toolbus.RunEnded
			if !decode(&re) {
				break
			}
			e.Status, e.Code = string(re.Status), re.Code
			e.Summary = fmt.Sprintf("run %s after %d step(s), %d tokens", re.Status, re.StepsUsed, re.Usage.Total())
			if re.Code != "" {
				e.Summary += " [" + re.Code + "]"
			}
			if re.Reason != "" {
				e.Details = append(e.Details, "reason: "+oneLine(re.Reason, 120))
			}
			for _, c := range re.Pending {
				e.Details = append(e.Details, fmt.Sprintf("pending: %s %s(%s)", c.CallID, c.Tool, oneLine(c.Arguments, 80)))
			}
			if re.Answer != "" {
				e.Details = append(e.Details, "answer: "+oneLine(re.Answer, 200))
			}
			if terminal != nil {
				addV(vTerminal, ev.Seq, e.Step, "", "outcome %s (#%d) after the run ended %s (#%d)", re.Status, ev.Seq, terminal.Status, terminal.Seq)
				break
			}
			r.Status, r.Code, r.Reason, r.Answer, r.Pending = re.Status, re.Code, re.Reason, re.Answer, re.Pending
			r.DurationMS = e.AtMS
			if re.Status.Terminal() {
				cp := e
				terminal = &cp
			}
			if re.Status == toolbus.RunCompleted {
				st := steps[e.Step]
				switch {
				case st == nil || st.responded == nil:
					addV(vTerminal, ev.Seq, e.Step, "", "run completed at step %d, which the model never answered", e.Step)
				case len(st.responded.Message.ToolCalls) > 0:
					addV(vTerminal, ev.Seq, e.Step, "", "run completed at step %d, whose answer asks for calls", e.Step)
				case st.responded.Message.Content != re.Answer:
					addV(vTerminal, ev.Seq, e.Step, "", "the completed answer is not the model's last message")
				}
			}

		default:
			e.Summary = "unknown event type " + typ
		}
		r.Timeline = append(r.Timeline, e)
	}

	if started == nil {
		addV(vNoRunStarted, 0, 0, "", "no run.started event for run %s", run)
	}
	// A request without a result is allowed only where the run stopped: it waits for a
	// decision, it was cancelled, or it is still under way (the last step).
	stopped := r.Status == toolbus.RunCancelled || r.Status == toolbus.RunWaitingForApproval || r.Status == toolbus.RunRunning
	for _, k := range order {
		rc := steps[k.step].calls[k.id]
		r.Calls = append(r.Calls, *rc)
		lastOfRun := k.step == lastStep
		switch {
		case rc.Result != nil:
		case rc.Requested > 0 && !(stopped && lastOfRun):
			addV(vMissingResult, 0, k.step, k.id, "call %s of step %d was requested but has no result (run %s)", k.id, k.step, r.Status)
		case rc.Requested == 0 && !lastOfRun:
			addV(vMissingRequest, 0, k.step, k.id, "call %s of step %d was never requested, yet the run went on", k.id, k.step)
		}
	}
	for _, st := range steps {
		if st.responded != nil {
			r.Steps++
		}
	}
	// The transcript: everything the model was sent, then its last answer (results that
	// came after it were never sent).
	r.Transcript = transcriptUpTo(lastStep)
	if st := steps[lastStep]; st != nil && st.responded != nil && started != nil {
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
	return r
}

func findCall(steps map[int]*stepState, step int, callID string) *replayCall {
	if st := steps[step]; st != nil {
		return st.calls[callID]
	}
	return nil
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

func toolMessageText(m toolbus.Message) string {
	flag := ""
	if m.IsError {
		flag = " [error]"
	}
	return fmt.Sprintf("tool %s %s%s: %s", m.ToolCallID, m.Name, flag, oneLine(m.Content, 100))
}

// writeReplay prints the report for people: the timeline, the transcript and the
// invariants.
func writeReplay(w io.Writer, r *replayReport) {
	fmt.Fprintf(w, "run %s: %s", r.RunID, r.Status)
	if r.Code != "" {
		fmt.Fprintf(w, " [%s]", r.Code)
	}
	fmt.Fprintf(w, " after %d step(s), %d tokens, %d ms, %d events\n", r.Steps, r.Usage.Total(), r.DurationMS, r.Events)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "timeline (stream order; +ms from run.started):")
	for _, e := range r.Timeline {
		label := e.Type
		if e.CallID != "" {
			label += " " + e.CallID
			if e.Tool != "" {
				label += " " + e.Tool
			}
		}
		mark := ""
		if e.AfterEnd {
			mark = " (after the end)"
		}
		fmt.Fprintf(w, "  #%-4d %8s  step %-2d %s: %s%s\n", e.Seq, "+"+strconv.FormatInt(e.AtMS, 10), e.Step, label, e.Summary, mark)
		for _, d := range e.Details {
			fmt.Fprintf(w, "  %24s%s\n", "", d)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "transcript (%d messages, as sent to the model", len(r.Transcript))
	for _, q := range r.Requests {
		fmt.Fprintf(w, "; step %d: 1-%d", q.Step, q.Messages)
	}
	fmt.Fprintln(w, "):")
	for i, m := range r.Transcript {
		var text string
		switch m.Role {
		case toolbus.RoleTool:
			text = toolMessageText(m)
		case toolbus.RoleAssistant:
			text = strings.TrimRight("assistant: "+oneLine(m.Content, 120), " ")
			if m.Reasoning != "" {
				text += " [reasoning: " + oneLine(m.Reasoning, 60) + "]"
			}
			for _, c := range m.ToolCalls {
				text += fmt.Sprintf("\n%8s-> %s %s(%s)", "", c.CallID, c.Tool, oneLine(c.Arguments, 80))
			}
		default:
			text = string(m.Role) + ": " + oneLine(m.Content, 120)
		}
		fmt.Fprintf(w, "  %3d  %s\n", i+1, strings.TrimRight(text, " "))
	}
	fmt.Fprintln(w)
	if r.OK {
		results := 0
		for _, c := range r.Calls {
			if c.Result != nil {
				results++
			}
		}
		fmt.Fprintf(w, "invariants: ok (%s, %s, one result per call, in call order, no orphan, terminal state consistent)\n",
			plural(len(r.Calls), "call"), plural(results, "result"))
		return
	}
	fmt.Fprintf(w, "invariants: %d violation(s)\n", len(r.Violations))
	for _, v := range r.Violations {
		where := ""
		if v.Seq != 0 {
			where = fmt.Sprintf(" #%d", v.Seq)
		}
		fmt.Fprintf(w, "  %s%s: %s\n", v.Code, where, v.Message)
	}
}

// plural counts things in English: 1 call, 2 calls.
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// writeJSON prints v as indented JSON, with <, > and & as they are.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// readRunEvents reads every stored event of a run, in stream order, with an ordered
// consumer: nothing is acknowledged, nothing is executed.
func readRunEvents(ctx context.Context, bus *events.Bus, run string) ([]auditEvent, error) {
	cons, err := bus.Reader().OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.SubjectRun(run)}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	// The consumer counts the run's events when it is created: read that many, so the
	// report is of one consistent prefix of the stream, and return without waiting.
	remaining := cons.CachedInfo().NumPending
	var out []auditEvent
	for remaining > 0 {
		batch, err := cons.Fetch(int(min(remaining, 512)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			ev := auditEvent{Subject: msg.Subject()}
			if md, err := msg.Metadata(); err == nil {
				ev.Seq, ev.Time, remaining = md.Sequence.Stream, md.Timestamp, md.NumPending
			}
			var data json.RawMessage
			meta, err := events.DecodeMsg(msg, &data)
			if err != nil {
				ev.Err = err.Error()
			}
			ev.Meta, ev.Data = meta, data
			out = append(out, ev)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, errNatsTimeout) {
			return nil, fmt.Errorf("replay: %w", err)
		}
		if n == 0 {
			return nil, fmt.Errorf("replay: the stream stopped delivering with %d event(s) of %s left", remaining, run)
		}
	}
	return out, nil
}

// cmdReplay prints the audit of a run and exits 1 when an invariant is broken.
func cmdReplay(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("replay", "replay <run> [--json]", errOut)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) != 1 {
		return usageError(fs, "replay: give the run id")
	}
	run := pos[0]
	if !toolbus.ValidRunID(run) {
		return &exitError{code: 2, msg: fmt.Sprintf("replay: invalid run id %q", run)}
	}
	c, err := openReader(ctx, cfg, quietLogger(cfg, log))
	if err != nil {
		return err
	}
	defer c.Close()
	evs, err := readRunEvents(ctx, c.bus, run)
	if err != nil {
		return err
	}
	if len(evs) == 0 {
		return &exitError{code: 1, msg: fmt.Sprintf("run %s not found: no events on %s", run, events.SubjectRun(run))}
	}
	r := analyzeRun(run, evs)
	if *asJSON {
		if err := writeJSON(out, r); err != nil {
			return err
		}
	} else {
		writeReplay(out, r)
	}
	if !r.OK {
		return &exitError{code: 1, msg: fmt.Sprintf("run %s breaks %d invariant(s)", run, len(r.Violations))}
	}
	return nil
}
