package events_test

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/internal/golden"
)

// The JSON of the contract types is the public contract: a change shows up here.
func TestContractGolden(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cases := map[string]any{
		"tool_result_failed": toolbus.ToolResult{CallID: "call_01", Tool: "lookup_incident", Status: toolbus.StatusFailed,
			Error:   &toolbus.ToolError{Code: "incident_not_found", Message: "no incident INC-404", Retryable: false},
			Content: `{"error":{"code":"incident_not_found","message":"no incident INC-404","retryable":false}}`,
			Attempt: 1, DurationMS: 12, Executor: "exec-1"},
		"tool_result_truncated": toolbus.ToolResult{CallID: "call_02", Tool: "big_output", Status: toolbus.StatusSucceeded,
			Content: "{...}", Truncated: &toolbus.Truncation{OriginalBytes: 5242880, KeptBytes: 16384, Ref: "kv://toolbus_outputs/big_output.r.0.call_02"},
			Redactions: 1, Attempt: 2, DurationMS: 40, Executor: "exec-2"},
		"assistant_message": toolbus.Message{Role: toolbus.RoleAssistant, Content: "Let me check.", Reasoning: "thinking",
			ReasoningSignature: "sig", ToolCalls: []toolbus.ToolCall{{CallID: "call_01", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-404"}`}}},
		"tool_message": toolbus.ToolMessage(toolbus.ToolResult{CallID: "call_01", Tool: "lookup_incident", Status: toolbus.StatusFailed, Content: "x"}),
		"run_started": toolbus.RunStarted{RunID: "run-1", Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "hi"}},
			AllowedTools: []string{"calculator"}, Limits: toolbus.Limits{MaxSteps: 5, Deadline: at, TokenBudget: 1000},
			Model: "openai:gpt-4o", Principal: toolbus.Principal{ID: "alice", Roles: []string{"oncall"}}, StartedAt: at},
		"tool_requested": toolbus.ToolRequested{RunID: "run-1", Step: 0, CallIndex: 1, CallCount: 2,
			Call: toolbus.ToolCall{CallID: "call_02", Tool: "calculator", Arguments: `{"expression":"1+1"}`}, Deadline: at,
			Principal: toolbus.Principal{ID: "alice"}},
		"run_ended": toolbus.RunEnded{RunID: "run-1", Status: toolbus.RunLimitReached, Code: toolbus.LimitMaxSteps,
			Reason: "max steps 5 reached", StepsUsed: 5, Usage: toolbus.Usage{InputTokens: 100, OutputTokens: 20}},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden.Check(t, filepath.Join("testdata", name+".golden.json"), append(got, '\n'))
		})
	}
}
