package models

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

// IncidentScript is the scripted model of the demo: it looks up INC-404 (which does not
// exist), repairs its call from the error it reads, looks up INC-001 and answers from
// the evidence the tool returned. No network, no API key.
func IncidentScript() planner.Model {
	return &planner.Script{Steps: []func(planner.Request) planner.Response{
		func(planner.Request) planner.Response {
			return planner.Response{Message: toolbus.Message{
				Content: "Let me look the incident up.",
				ToolCalls: []toolbus.ToolCall{
					{CallID: "call_lookup", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-404"}`},
					{CallID: "call_calc", Tool: "calculator", Arguments: `{"expression":"17 * 38 + 55"}`},
				},
			}, Usage: toolbus.Usage{InputTokens: 120, OutputTokens: 30}}
		},
		func(req planner.Request) planner.Response {
			last := lastTool(req.Messages, "call_lookup")
			if last != nil && last.IsError {
				return planner.Response{Message: toolbus.Message{
					Content:   "INC-404 does not exist; the user probably means the open incident INC-001.",
					ToolCalls: []toolbus.ToolCall{{CallID: "call_lookup", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-001"}`}},
				}, Usage: toolbus.Usage{InputTokens: 260, OutputTokens: 40}}
			}
			return planner.Response{Message: toolbus.Message{Content: "I could not find a matching incident."}}
		},
		func(req planner.Request) planner.Response {
			answer := "INC-404 does not exist."
			if last := lastTool(req.Messages, "call_lookup"); last != nil && !last.IsError {
				var inc struct {
					ID       string   `json:"incident_id"`
					Service  string   `json:"service"`
					Severity string   `json:"severity"`
					Summary  string   `json:"summary"`
					Evidence []string `json:"evidence"`
				}
				if json.Unmarshal([]byte(last.Content), &inc) == nil {
					answer = fmt.Sprintf("INC-404 does not exist. %s is a %s-severity incident on %s: %s (%s pieces of evidence",
						inc.ID, inc.Severity, inc.Service, inc.Summary, strconv.Itoa(len(inc.Evidence)))
					if len(inc.Evidence) > 0 {
						answer += ", e.g. " + inc.Evidence[0]
					}
					answer += ")."
				}
			}
			return planner.Response{Message: toolbus.Message{Content: answer}, Usage: toolbus.Usage{InputTokens: 400, OutputTokens: 60}}
		},
	}}
}

// ApprovalScript is the scripted model of the approval demo: it looks INC-001 up and asks
// to restart auth-api in the same step. restart_service needs approval, so the run waits
// (toolbus run exits 3) until `toolbus approve <run> call_restart` or `toolbus deny`; the
// model then answers from what it read.
func ApprovalScript() planner.Model {
	return &planner.Script{Steps: []func(planner.Request) planner.Response{
		func(planner.Request) planner.Response {
			return planner.Response{Message: toolbus.Message{
				Content: "I will check INC-001 and restart the affected service.",
				ToolCalls: []toolbus.ToolCall{
					{CallID: "call_lookup", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-001"}`},
					{CallID: "call_restart", Tool: "restart_service", Arguments: `{"service":"auth-api"}`},
				},
			}}
		},
		func(req planner.Request) planner.Response {
			answer := "INC-001: auth-api was restarted."
			if m := lastTool(req.Messages, "call_restart"); m != nil && m.IsError {
				answer = "INC-001: the restart of auth-api was not approved (" + m.Content + "); the connection pool is still exhausted."
			}
			return planner.Response{Message: toolbus.Message{Content: answer}}
		},
	}}
}

// lastTool returns the last tool message answering callID.
func lastTool(msgs []toolbus.Message, callID string) *toolbus.Message {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == toolbus.RoleTool && msgs[i].ToolCallID == callID {
			return &msgs[i]
		}
	}
	return nil
}
