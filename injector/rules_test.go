package injector_test

import (
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/injector"
)

func TestRulesDecide(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	result := func(status events.Status, code string) *events.ToolResult {
		r := &events.ToolResult{CallID: "c", Tool: "t", Status: status}
		if code != "" {
			r.Error = &events.ToolError{Code: code, Message: "m"}
		}
		return r
	}
	step := func(n int, rs ...*events.ToolResult) *events.StepRecord {
		rec := events.NewStepRecord("r", n, len(rs))
		copy(rec.Results, rs)
		return rec
	}
	tests := []struct {
		name   string
		rules  injector.Rules
		limits events.Limits
		rec    *events.StepRecord
		want   events.RunStatus // "" = continue
		code   string
	}{
		{"all succeeded: continue", injector.Rules{}, events.Limits{}, step(0, result(events.StatusSucceeded, ""), result(events.StatusSucceeded, "")), "", ""},
		{"recoverable error: back to the model", injector.Rules{}, events.Limits{}, step(0, result(events.StatusRejected, events.CodeInvalidArguments)), "", ""},
		{"tool's own code: back to the model", injector.Rules{}, events.Limits{}, step(0, result(events.StatusFailed, "incident_not_found")), "", ""},
		{"timeout: back to the model", injector.Rules{}, events.Limits{}, step(0, result(events.StatusTimedOut, events.CodeTimeout)), "", ""},
		{"unknown tool fails", injector.Rules{}, events.Limits{}, step(0, result(events.StatusSucceeded, ""), result(events.StatusRejected, events.CodeUnknownTool)), events.RunFailed, events.CodeUnknownTool},
		{"panic fails", injector.Rules{}, events.Limits{}, step(0, result(events.StatusFailed, events.CodeToolInternalError)), events.RunFailed, events.CodeToolInternalError},
		{"bad output fails", injector.Rules{}, events.Limits{}, step(0, result(events.StatusFailed, events.CodeInvalidToolOutput)), events.RunFailed, events.CodeInvalidToolOutput},
		{"configured fail codes", injector.Rules{FailOn: []string{events.CodeTimeout}}, events.Limits{}, step(0, result(events.StatusTimedOut, events.CodeTimeout)), events.RunFailed, events.CodeTimeout},
		{"configured: unknown tool recoverable", injector.Rules{FailOn: []string{}}, events.Limits{}, step(0, result(events.StatusRejected, events.CodeUnknownTool)), "", ""},
		{"run max steps", injector.Rules{}, events.Limits{MaxSteps: 3}, step(2, result(events.StatusSucceeded, "")), events.RunLimitReached, events.LimitMaxSteps},
		{"below run max steps", injector.Rules{}, events.Limits{MaxSteps: 3}, step(1, result(events.StatusSucceeded, "")), "", ""},
		{"default max steps", injector.Rules{MaxSteps: 2}, events.Limits{}, step(1, result(events.StatusSucceeded, "")), events.RunLimitReached, events.LimitMaxSteps},
		{"deadline passed", injector.Rules{}, events.Limits{Deadline: now.Add(-time.Second)}, step(0, result(events.StatusSucceeded, "")), events.RunLimitReached, events.LimitDeadline},
		{"deadline ahead", injector.Rules{}, events.Limits{Deadline: now.Add(time.Second)}, step(0, result(events.StatusSucceeded, "")), "", ""},
		{"failure wins over limits", injector.Rules{}, events.Limits{MaxSteps: 1}, step(0, result(events.StatusRejected, events.CodeUnknownTool)), events.RunFailed, events.CodeUnknownTool},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.rules.Now = func() time.Time { return now }
			got := tc.rules.Decide(&events.RunStarted{RunID: "r", Limits: tc.limits}, tc.rec)
			switch {
			case tc.want == "" && got != nil:
				t.Fatalf("got %s/%s (%s), want to continue", got.Status, got.Code, got.Reason)
			case tc.want != "" && got == nil:
				t.Fatalf("continued, want %s/%s", tc.want, tc.code)
			case got != nil && (got.Status != tc.want || got.Code != tc.code || got.StepsUsed != tc.rec.Step+1):
				t.Fatalf("got %s/%s after %d steps, want %s/%s after %d", got.Status, got.Code, got.StepsUsed, tc.want, tc.code, tc.rec.Step+1)
			}
		})
	}
}
