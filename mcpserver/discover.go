package mcpserver

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// missingElicitation is the error of a 2026-07-28 request whose tool asked a question
// while the request declared no elicitation (form) capability: the door relies on no
// capability a client did not declare (SEP-2575), and the tool got a cancel answer.
func missingElicitation() error {
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{"elicitation": map[string]any{"form": map[string]any{}}}})
	return &jsonrpc.Error{Code: mcp.CodeMissingRequiredClientCapabilities, Message: "Missing required client capability: the tool asks a question (elicitation)", Data: data}
}
