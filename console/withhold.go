package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Withholding: a console user restricted to teams (tenancy.go) sees, in a run they see
// but neither started nor approve, only their own teams' calls in full. Of every other call (another
// team's tool, or a tool of no team) the arguments, outputs, errors, progress and log
// lines, questions, answers and decisions' arguments are replaced by a line that names
// the tool's owner, in the run page, its transcript and its raw events alike: they all
// read the run's events through reading.events. Which tool a call is of comes from what
// the core recorded (the planner's assistant message and its tool.requested); an event
// of a tool's own (a result, a log line) is that tool's, whose subject it is on.
// The run's principal and approvers and a user without teams read every call in full.

// reading says which calls of one run a viewer reads in full.
type reading struct {
	all    bool
	v      viewer
	owners map[string]string
	// tools are the tools of each call id the core recorded (call ids repeat across
	// steps): an answer or a decision names only its call.
	tools map[string][]string
}

// readingOf returns what v reads of run: every call when the run's first run.started
// names v (its principal or one of its approvers), as the read service of client
// accounts gives them the whole run.
func (c *server) readingOf(ctx context.Context, v viewer, run string) (*reading, error) {
	if !v.restricted {
		return &reading{all: true}, nil
	}
	rs, err := c.bus.RunStarted(ctx, run)
	switch {
	case err == nil && rs.NamesDecider(v.name):
		return &reading{all: true}, nil
	case err != nil && !errors.Is(err, events.ErrRunNotFound):
		return nil, err
	}
	owners, err := c.owners(ctx)
	if err != nil {
		return nil, err
	}
	return &reading{v: v, owners: owners, tools: map[string][]string{}}, nil
}

// full reports whether the viewer reads the calls of tool in full.
func (rd *reading) full(tool string) bool { return rd.all || rd.v.ownsTool(rd.owners[tool]) }

// fullCall reports whether the viewer reads call callID in full: every tool the core
// recorded for it is read in full (a call the core never recorded is not).
func (rd *reading) fullCall(callID string) bool {
	if rd.all {
		return true
	}
	tools := rd.tools[callID]
	for _, t := range tools {
		if !rd.full(t) {
			return false
		}
	}
	return len(tools) > 0
}

// note is what stands in for what is withheld of a call of tool.
func (rd *reading) note(tool string) string {
	return fmt.Sprintf("withheld: a call of %s tool %s (only its team's users read it)", ownerText(rd.owners[tool]), tool)
}

// calls withholds the arguments of the calls the viewer does not read in full.
func (rd *reading) calls(calls []toolbus.ToolCall) []toolbus.ToolCall {
	if rd.all || len(calls) == 0 {
		return calls
	}
	out := make([]toolbus.ToolCall, len(calls))
	for i, c := range calls {
		if !rd.full(c.Tool) {
			c.Arguments = rd.note(c.Tool)
		}
		out[i] = c
	}
	return out
}

// result withholds what a result of a call of tool says.
func (rd *reading) result(r toolbus.ToolResult) toolbus.ToolResult {
	if rd.full(r.Tool) {
		return r
	}
	note := rd.note(r.Tool)
	r.Output, r.Content, r.Attachments = nil, note, nil
	if r.Error != nil {
		e := *r.Error
		e.Message, e.Details = note, nil
		r.Error = &e
	}
	if r.Truncated != nil {
		t := *r.Truncated
		t.Ref = "" // the console reads no output it withholds
		r.Truncated = &t
	}
	if r.Human != nil && r.Human.Arguments != "" {
		h := *r.Human
		h.Arguments = note
		r.Human = &h
	}
	if len(r.Retries) > 0 {
		retries := make([]toolbus.FailedAttempt, len(r.Retries))
		for i, fa := range r.Retries {
			fa.Error.Message, fa.Error.Details = note, nil
			retries[i] = fa
		}
		r.Retries = retries
	}
	return r
}

// events returns the run's events with what the viewer does not read withheld.
func (rd *reading) events(evs []runlog.StoredEvent) []runlog.StoredEvent {
	if rd.all {
		return evs
	}
	for _, ev := range evs { // the calls the core recorded
		var calls []toolbus.ToolCall
		switch ev.Meta.Type {
		case events.TypeModelResponded:
			var mr toolbus.ModelResponded
			if ev.Decode(&mr) == nil {
				calls = mr.Message.ToolCalls
			}
		case events.TypeToolRequested:
			var tr toolbus.ToolRequested
			if ev.Decode(&tr) == nil {
				calls = []toolbus.ToolCall{tr.Call}
			}
		}
		for _, c := range calls {
			rd.tools[c.CallID] = append(rd.tools[c.CallID], c.Tool)
		}
	}
	out := make([]runlog.StoredEvent, len(evs))
	for i, ev := range evs {
		out[i] = ev
		if ev.Err != nil {
			out[i].Data = nil // it counts for no run, and names whatever it likes
			continue
		}
		if data, ok := rd.withhold(ev); ok {
			out[i].Data = data
		}
	}
	return out
}

// withhold returns the data of ev with what the viewer does not read withheld, and
// whether anything was.
func (rd *reading) withhold(ev runlog.StoredEvent) (json.RawMessage, bool) {
	switch typ := ev.Meta.Type; {
	case typ == events.TypeRunStarted:
		return edit(ev, func(rs *toolbus.RunStarted) { rs.Calls = rd.calls(rs.Calls) })
	case typ == events.TypeModelRequested:
		return edit(ev, func(mr *toolbus.ModelRequested) {
			for i, r := range mr.PrevResults {
				mr.PrevResults[i] = rd.result(r)
			}
		})
	case typ == events.TypeModelResponded:
		return edit(ev, func(mr *toolbus.ModelResponded) {
			calls := rd.calls(mr.Message.ToolCalls)
			for i := range calls {
				if calls[i].Arguments != mr.Message.ToolCalls[i].Arguments {
					mr.Message.Raw = nil // the provider's message repeats the arguments
				}
			}
			mr.Message.ToolCalls = calls
		})
	case typ == events.TypeToolRequested:
		return edit(ev, func(tr *toolbus.ToolRequested) { tr.Call = rd.calls([]toolbus.ToolCall{tr.Call})[0] })
	case typ == events.TypeToolWaiting:
		return edit(ev, func(tw *toolbus.ToolWaiting) { tw.Call = rd.calls([]toolbus.ToolCall{tw.Call})[0] })
	case typ == events.TypeToolFinished:
		return edit(ev, func(tf *toolbus.ToolFinished) { tf.ToolResult = rd.result(tf.ToolResult) })
	case typ == events.TypeToolProgress:
		return edit(ev, func(tp *toolbus.ToolProgress) {
			if !rd.full(tp.Tool) {
				tp.Message = rd.note(tp.Tool)
			}
		})
	case typ == events.TypeToolLog:
		return edit(ev, func(tl *toolbus.ToolLog) {
			if !rd.full(tl.Tool) {
				tl.Message, tl.Attrs = rd.note(tl.Tool), nil
			}
		})
	case typ == events.TypeToolQuestion:
		return edit(ev, func(tq *toolbus.ToolQuestion) {
			if !rd.full(tq.Tool) {
				tq.Message, tq.Schema = rd.note(tq.Tool), nil
			}
		})
	case typ == events.TypeToolAnswer:
		return edit(ev, func(a *toolbus.ToolAnswer) {
			if !rd.fullCall(a.CallID) {
				a.Content, a.Reason = nil, rd.callNote(a.CallID)
			}
		})
	case typ == events.TypeApprovalGranted || typ == events.TypeApprovalDenied:
		return edit(ev, func(a *toolbus.Approval) {
			if !rd.fullCall(a.CallID) && (a.Arguments != "" || a.Response != "") {
				a.Arguments, a.Response = "", rd.callNote(a.CallID)
			}
		})
	case ev.IsRunEnded():
		return edit(ev, func(re *toolbus.RunEnded) {
			re.Pending, re.Unanswered = rd.calls(re.Pending), rd.calls(re.Unanswered)
		})
	}
	return nil, false
}

// callNote is note for call callID, by the tools the core recorded for it.
func (rd *reading) callNote(callID string) string {
	for _, t := range rd.tools[callID] {
		if !rd.full(t) {
			return rd.note(t)
		}
	}
	return "withheld: a call the run did not request"
}

// edit decodes ev's data as a T, applies f and encodes it again; ok when the data
// changed.
func edit[T any](ev runlog.StoredEvent, f func(*T)) (json.RawMessage, bool) {
	var v T
	if json.Unmarshal(ev.Data, &v) != nil {
		return nil, false
	}
	before, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	f(&v)
	after, err := json.Marshal(v)
	if err != nil || string(after) == string(before) {
		return nil, false
	}
	return after, true
}
