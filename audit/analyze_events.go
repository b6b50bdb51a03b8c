package audit

import (
	"fmt"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/runlog"
)

// What each event of a run tells the analysis, and the invariants it checks on the way:
// one handler per event type.

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
