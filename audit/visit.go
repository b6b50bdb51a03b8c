// Package audit reads a run back from its events: one walk over the events in stream
// order with one callback per event type (Visitor), and the audit of a run (Analyze):
// its timeline, the transcript the model was sent, its calls and the invariants of the
// contract it keeps or breaks; Report.Layout places the steps and calls on the run's
// time axis (the web console's run model). It is a pure function of the events: it
// reads no store and no clock. `toolbus replay`, the live printer, the web console and the e2e and
// faults checks read runs through it; runlog.Events and runlog.Watch read
// the events.
package audit

import (
	"encoding/json"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Visitor has one callback per event type of a run. Visit decodes an event's data into
// its contract type and calls the event type's callback; a nil callback skips its
// events (and their decoding).
type Visitor struct {
	RunStarted     func(runlog.StoredEvent, toolbus.RunStarted)
	ModelRequested func(runlog.StoredEvent, toolbus.ModelRequested)
	ModelResponded func(runlog.StoredEvent, toolbus.ModelResponded)
	ToolRequested  func(runlog.StoredEvent, toolbus.ToolRequested)
	ToolWaiting    func(runlog.StoredEvent, toolbus.ToolWaiting)
	ToolProgress   func(runlog.StoredEvent, toolbus.ToolProgress)
	ToolLog        func(runlog.StoredEvent, toolbus.ToolLog)
	ToolQuestion   func(runlog.StoredEvent, toolbus.ToolQuestion)
	ToolAnswer     func(runlog.StoredEvent, toolbus.ToolAnswer)
	ToolFinished   func(runlog.StoredEvent, toolbus.ToolFinished)
	// Approval gets toolbus.approval.granted (granted) and toolbus.approval.denied.
	Approval func(ev runlog.StoredEvent, a toolbus.Approval, granted bool)
	Cancel   func(runlog.StoredEvent, toolbus.Cancel)
	// Timer gets the run's deadline timer (toolbus.timer.deadline), which the injector
	// publishes when it starts the run.
	Timer func(runlog.StoredEvent, events.RunTimer)
	// RunEnded gets the run's outcomes (toolbus.run.<status>).
	RunEnded func(runlog.StoredEvent, toolbus.RunEnded)
	// Undecodable gets a message that is not a toolbus event (ev.Err is set), an event
	// whose subject and body disagree (ev.Err wraps events.ErrSubjectMismatch: it counts
	// for no run) or whose data does not decode into its type (err is the decoding
	// error).
	Undecodable func(ev runlog.StoredEvent, err error)
	// Other gets an event of a type with no callback above.
	Other func(runlog.StoredEvent)
}

// Walk visits the events in order.
func (v *Visitor) Walk(evs []runlog.StoredEvent) {
	for _, ev := range evs {
		v.Visit(ev)
	}
}

// Visit calls the callback of the event's type.
func (v *Visitor) Visit(ev runlog.StoredEvent) {
	if ev.Err != nil {
		if v.Undecodable != nil {
			v.Undecodable(ev, ev.Err)
		}
		return
	}
	switch typ := ev.Meta.Type; {
	case typ == events.TypeRunStarted:
		visit(v, ev, v.RunStarted)
	case typ == events.TypeModelRequested:
		visit(v, ev, v.ModelRequested)
	case typ == events.TypeModelResponded:
		visit(v, ev, v.ModelResponded)
	case typ == events.TypeToolRequested:
		visit(v, ev, v.ToolRequested)
	case typ == events.TypeToolWaiting:
		visit(v, ev, v.ToolWaiting)
	case typ == events.TypeToolFinished:
		visit(v, ev, v.ToolFinished)
	case typ == events.TypeToolProgress:
		visit(v, ev, v.ToolProgress)
	case typ == events.TypeToolLog:
		visit(v, ev, v.ToolLog)
	case typ == events.TypeToolQuestion:
		visit(v, ev, v.ToolQuestion)
	case typ == events.TypeToolAnswer:
		visit(v, ev, v.ToolAnswer)
	case typ == events.TypeApprovalGranted || typ == events.TypeApprovalDenied:
		if v.Approval != nil {
			visit(v, ev, func(ev runlog.StoredEvent, a toolbus.Approval) { v.Approval(ev, a, typ == events.TypeApprovalGranted) })
		}
	case typ == events.TypeRunCancel:
		visit(v, ev, v.Cancel)
	case typ == events.TypeRunTimer:
		visit(v, ev, v.Timer)
	case events.IsRunEndedType(typ):
		visit(v, ev, v.RunEnded)
	default:
		if v.Other != nil {
			v.Other(ev)
		}
	}
}

// visit decodes the event's data as a T and calls fn with it.
func visit[T any](v *Visitor, ev runlog.StoredEvent, fn func(runlog.StoredEvent, T)) {
	if fn == nil {
		return
	}
	var data T
	if err := json.Unmarshal(ev.Data, &data); err != nil {
		if v.Undecodable != nil {
			v.Undecodable(ev, err)
		}
		return
	}
	fn(ev, data)
}
