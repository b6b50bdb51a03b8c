package injector_test

import (
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/injector"
)

func TestRulesDecide(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	result := func(status toolbus.Status, code string) *toolbus.ToolResult {
		r := &toolbus.ToolResult{CallID: "c", Tool: "t", Status: status}
		if code != "" {
			r.Error = &toolbus.ToolError{Code: code, Message: "m"}
		}
		return r
	}
	step := func(n int, rs ...*toolbus.ToolResult) *events.StepRecord {
		rec := events.NewStepRecord("r", n, len(rs))
		copy(rec.Results, rs)
		return rec
	}
	tests := []struct {
		name   string
		rules  injector.Rules
		limits toolbus.Limits
		rec    *events.StepRecord
		want   toolbus.RunStatus // "" = continue
		code   string
	}{
		{"all succeeded: continue", injector.Rules{}, toolbus.Limits{}, step(0, result(toolbus.StatusSucceeded, ""), result(toolbus.StatusSucceeded, "")), "", ""},
		{"recoverable error: back to the model", injector.Rules{}, toolbus.Limits{}, step(0, result(toolbus.StatusRejected, toolbus.CodeInvalidArguments)), "", ""},
		{"tool's own code: back to the model", injector.Rules{}, toolbus.Limits{}, step(0, result(toolbus.StatusFailed, "incident_not_found")), "", ""},
		{"timeout: back to the model", injector.Rules{}, toolbus.Limits{}, step(0, result(toolbus.StatusTimedOut, toolbus.CodeTimeout)), "", ""},
		{"unknown tool fails", injector.Rules{}, toolbus.Limits{}, step(0, result(toolbus.StatusSucceeded, ""), result(toolbus.StatusRejected, toolbus.CodeUnknownTool)), toolbus.RunFailed, toolbus.CodeUnknownTool},
		{"panic fails", injector.Rules{}, toolbus.Limits{}, step(0, result(toolbus.StatusFailed, toolbus.CodeToolInternalError)), toolbus.RunFailed, toolbus.CodeToolInternalError},
		{"bad output fails", injector.Rules{}, toolbus.Limits{}, step(0, result(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput)), toolbus.RunFailed, toolbus.CodeInvalidToolOutput},
		{"configured fail codes", injector.Rules{FailOn: []string{toolbus.CodeTimeout}}, toolbus.Limits{}, step(0, result(toolbus.StatusTimedOut, toolbus.CodeTimeout)), toolbus.RunFailed, toolbus.CodeTimeout},
		{"configured: unknown tool recoverable", injector.Rules{FailOn: []string{}}, toolbus.Limits{}, step(0, result(toolbus.StatusRejected, toolbus.CodeUnknownTool)), "", ""},
		{"run max steps", injector.Rules{}, toolbus.Limits{MaxSteps: 3}, step(2, result(toolbus.StatusSucceeded, "")), toolbus.RunLimitReached, toolbus.LimitMaxSteps},
		{"below run max steps", injector.Rules{}, toolbus.Limits{MaxSteps: 3}, step(1, result(toolbus.StatusSucceeded, "")), "", ""},
		{"default max steps", injector.Rules{MaxSteps: 2}, toolbus.Limits{}, step(1, result(toolbus.StatusSucceeded, "")), toolbus.RunLimitReached, toolbus.LimitMaxSteps},
		{"deadline passed", injector.Rules{}, toolbus.Limits{Deadline: now.Add(-time.Second)}, step(0, result(toolbus.StatusSucceeded, "")), toolbus.RunLimitReached, toolbus.LimitDeadline},
		{"deadline ahead", injector.Rules{}, toolbus.Limits{Deadline: now.Add(time.Second)}, step(0, result(toolbus.StatusSucceeded, "")), "", ""},
		{"failure wins over limits", injector.Rules{}, toolbus.Limits{MaxSteps: 1}, step(0, result(toolbus.StatusRejected, toolbus.CodeUnknownTool)), toolbus.RunFailed, toolbus.CodeUnknownTool},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.rules.Now = func() time.Time { return now }
			got := tc.rules.Decide(&toolbus.RunStarted{RunID: "r", Limits: tc.limits}, tc.rec)
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
