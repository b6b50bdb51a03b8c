package audit

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// The analysis: Analyze walks a run's events once, keeping what it knows of each step
// and call, then checks what only the whole run shows (finish).

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

// Analyze audits the events of one run, given in stream order (events.Bus.RunEvents).
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
