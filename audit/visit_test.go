package audit

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// recorder is a Visitor that names the callback each event reached.
func recorder(got *[]string) Visitor {
	rec := func(name string) { *got = append(*got, name) }
	return Visitor{
		RunStarted:     func(runlog.StoredEvent, toolbus.RunStarted) { rec("RunStarted") },
		ModelRequested: func(runlog.StoredEvent, toolbus.ModelRequested) { rec("ModelRequested") },
		ModelResponded: func(runlog.StoredEvent, toolbus.ModelResponded) { rec("ModelResponded") },
		ToolRequested:  func(runlog.StoredEvent, toolbus.ToolRequested) { rec("ToolRequested") },
		ToolWaiting:    func(runlog.StoredEvent, toolbus.ToolWaiting) { rec("ToolWaiting") },
		ToolFinished:   func(runlog.StoredEvent, toolbus.ToolFinished) { rec("ToolFinished") },
		Approval: func(_ runlog.StoredEvent, _ toolbus.Approval, granted bool) {
			if granted {
				rec("Approval granted")
			} else {
				rec("Approval denied")
			}
		},
		Cancel:      func(runlog.StoredEvent, toolbus.Cancel) { rec("Cancel") },
		Timer:       func(_ runlog.StoredEvent, t events.RunTimer) { rec("Timer " + t.RunID) },
		RunEnded:    func(_ runlog.StoredEvent, re toolbus.RunEnded) { rec("RunEnded " + string(re.Status)) },
		Undecodable: func(ev runlog.StoredEvent, err error) { rec("Undecodable " + ev.Meta.Type) },
		Other:       func(ev runlog.StoredEvent) { rec("Other " + ev.Meta.Type) },
	}
}

// Each event type reaches its callback, in stream order.
func TestVisitorDispatch(t *testing.T) {
	l := newRunLog(t, "run-v")
	x := rcall("x", "noop", `{}`)
	l.started()
	l.requested(1, 0)
	l.responded(1, 0, "", 10, x)
	l.toolRequested(1, 0, 0, 1, x, false)
	l.waiting(1, 0, 0, 1, x)
	l.approval(1, 0, "x", true, "ann", "")
	l.approval(1, 0, "x", false, "bob", "no")
	l.finished(1, 0, 0, 1, rok("x", "noop", `{}`), "")
	l.cancel(1, "stop", "ann")
	l.ended(1, 0, toolbus.RunEnded{Status: toolbus.RunCancelled})
	l.add(1, "toolbus.run-v.timer.deadline", events.Meta{ID: "t1", Type: events.TypeRunTimer}, map[string]any{"run_id": "run-v"})
	l.add(1, "toolbus.run-v.other", events.Meta{ID: "o1", Type: "toolbus.something.new"}, map[string]any{})

	var got []string
	v := recorder(&got)
	v.Walk(l.evs)
	want := []string{"RunStarted", "ModelRequested", "ModelResponded", "ToolRequested", "ToolWaiting",
		"Approval granted", "Approval denied", "ToolFinished", "Cancel", "RunEnded cancelled", "Timer run-v",
		"Other toolbus.something.new"}
	if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
		t.Fatalf("visited %s, want %s", g, w)
	}
}

// A message that is not an event, and an event whose data does not decode into its
// type, reach Undecodable; a nil callback skips its events without decoding them.
func TestVisitorUndecodable(t *testing.T) {
	notEvent := errors.New("not a CloudEvent")
	tests := []struct {
		name    string
		ev      runlog.StoredEvent
		want    string
		wantErr error
	}{
		{"not an event", runlog.StoredEvent{Seq: 1, Subject: "toolbus.r.tool.requested.x", Err: notEvent}, "Undecodable ", notEvent},
		{"bad data", runlog.StoredEvent{Seq: 2, Meta: events.Meta{Type: events.TypeToolFinished}, Data: json.RawMessage(`{"step":"one"}`)}, "Undecodable toolbus.tool.finished", nil},
		{"bad data of a skipped type", runlog.StoredEvent{Seq: 3, Meta: events.Meta{Type: events.TypeModelRequested}, Data: json.RawMessage(`[`)}, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			var gotErr error
			v := recorder(&got)
			v.ModelRequested = nil
			v.Undecodable = func(ev runlog.StoredEvent, err error) {
				got = append(got, "Undecodable "+ev.Meta.Type)
				gotErr = err
			}
			v.Visit(tt.ev)
			if tt.want == "" {
				if len(got) != 0 {
					t.Fatalf("visited %v, want nothing", got)
				}
				return
			}
			if len(got) != 1 || got[0] != tt.want {
				t.Fatalf("visited %v, want [%s]", got, tt.want)
			}
			if gotErr == nil || (tt.wantErr != nil && !errors.Is(gotErr, tt.wantErr)) {
				t.Fatalf("error %v, want %v", gotErr, tt.wantErr)
			}
		})
	}
}
