package mcpserver

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// missingCapability is the error of a 2026-07-28 request whose tool asked what the host
// cannot answer (it declared no capability for it): the door relies on no capability a
// client did not declare (SEP-2575), and the tool got a cancel answer.
func missingCapability(capability string) error {
	want := map[string]any{}
	if capability == "elicitation" {
		want["form"] = map[string]any{}
	}
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{capability: want}})
	return &jsonrpc.Error{Code: mcp.CodeMissingRequiredClientCapabilities, Data: data,
		Message: "Missing required client capability: the tool asks " + capability}
}

// missingTasks is the error of a request that needs the Tasks extension (a tasks/*
// request, or a call of a tool that requires a task) from a client that did not declare it.
func missingTasks() error {
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{ExtTasks: map[string]any{}}}})
	return &jsonrpc.Error{Code: mcp.CodeMissingRequiredClientCapabilities, Message: "Missing required client capability", Data: data}
}
