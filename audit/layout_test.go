package audit

import (
	"testing"

	"github.com/toolbus/toolbus"
)

// Layout places the model call and each call of a step on the run's time axis, calls in
// call order, unanswered ones running to the end of the axis.
func TestLayout(t *testing.T) {
	l := newRunLog(t, "run-l")
	x, y := rcall("x", "deploy", `{}`), rcall("y", "noop", `{}`)
	l.started()                                        // +0
	l.requested(2, 0)                                  // +2
	l.responded(5, 0, "", 10, x, y)                    // +7
	l.toolRequested(1, 0, 1, 2, y, false)              // +8
	l.waiting(1, 0, 0, 2, x)                           // +9
	l.finished(3, 0, 1, 2, rok("y", "noop", `{}`), "") // +12
	l.requested(2, 1)                                  // +14: not answered yet

	steps, span := Analyze(l.run, l.evs).Layout()
	if span != 14 {
		t.Fatalf("span %d, want 14", span)
	}
	if len(steps) != 2 || steps[0].N != 0 || steps[1].N != 1 {
		t.Fatalf("steps %+v", steps)
	}
	s0 := steps[0]
	if !s0.Requested || !s0.Responded || s0.ModelFrom != 2 || s0.ModelTo != 7 {
		t.Fatalf("step 0 model %+v", s0)
	}
	s1 := steps[1]
	if !s1.Requested || s1.Responded || s1.ModelFrom != 14 || s1.ModelTo != 14 || len(s1.Calls) != 0 {
		t.Fatalf("step 1 %+v", s1)
	}
	if len(s0.Calls) != 2 {
		t.Fatalf("calls %+v", s0.Calls)
	}
	tests := []struct {
		got        CallLayout
		id         string
		start, end int64
		running    bool
		status     string
	}{
		{s0.Calls[0], "x", 9, 14, true, "waiting"},
		{s0.Calls[1], "y", 8, 12, false, string(toolbus.StatusSucceeded)},
	}
	for _, tt := range tests {
		g := tt.got
		if g.CallID != tt.id || g.Start != tt.start || g.End != tt.end || g.Running != tt.running || g.Status != tt.status {
			t.Errorf("call %+v, want %s %d-%d running %v %s", g, tt.id, tt.start, tt.end, tt.running, tt.status)
		}
	}
}
