package timeline

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
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
