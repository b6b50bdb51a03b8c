package mcpserver

import (
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
)

// What a tool asks of its caller's host (tool.question's method): its user's answer to a
// form (elicitation), a completion of its model (sampling) or its roots. Each is an input
// request of the same input_required result and round trip; the host answers only what
// it declared a capability for (questionCapability).

// questionMethod is q's input request method.
func questionMethod(q toolbus.ToolQuestion) string {
	if q.Method == "" {
		return toolbus.AskElicit
	}
	return q.Method
}

// inputRequest is q as an MCP input request.
func inputRequest(q toolbus.ToolQuestion) mcp.InputRequest {
	switch q.Method {
	case toolbus.AskSample:
		var p mcp.CreateMessageParams
		_ = json.Unmarshal(q.Params, &p) //nolint:errcheck // the executor checked it is an object
		return &p
	case toolbus.AskRoots:
		return &mcp.ListRootsParams{}
	}
	var schema map[string]any
	_ = json.Unmarshal(q.Schema, &schema) //nolint:errcheck // the executor checked it is an object schema
	return &mcp.ElicitParams{Message: q.Message, RequestedSchema: schema}
}

// questionCapability is the client capability a host needs to answer q and whether caps
// declares it.
func questionCapability(caps *mcp.ClientCapabilities, q toolbus.ToolQuestion) (string, bool) {
	switch q.Method {
	case toolbus.AskSample:
		return "sampling", caps != nil && caps.Sampling != nil
	case toolbus.AskRoots:
		return "roots", caps != nil && caps.RootsV2 != nil
	}
	return "elicitation", canElicit(caps)
}

// answerOf is the tool.answer of q from the host's response res (nil: none sent): an
// elicitation's action and content, or a sampling or roots result as accepted content; a
// decline or cancel is one whatever was asked, and a result of another kind is cancel.
func answerOf(q toolbus.ToolQuestion, res mcp.InputResponse) (toolbus.ToolAnswer, error) {
	a := toolbus.ToolAnswer{RunID: q.RunID, Step: q.Step, CallID: q.CallID, Tool: q.Tool, Attempt: q.Attempt, Seq: q.Seq, Action: "cancel"}
	method := questionMethod(q)
	var (
		content any
		fits    bool
	)
	switch r := res.(type) {
	case nil:
		a.Reason = "the MCP host sent no answer"
		return a, nil
	case *mcp.ElicitResult:
		if r.Action != "accept" {
			a.Action = r.Action
			return a, nil
		}
		content, fits = r.Content, method == toolbus.AskElicit
	case *mcp.CreateMessageWithToolsResult, *mcp.CreateMessageResult:
		content, fits = r, method == toolbus.AskSample
	case *mcp.ListRootsResult:
		content, fits = r, method == toolbus.AskRoots
	}
	if !fits {
		a.Reason = fmt.Sprintf("the MCP host answered %s with a %T", method, res)
		return a, nil
	}
	c, err := json.Marshal(content)
	if err != nil {
		return a, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "the answer's content is not JSON: " + err.Error()}
	}
	a.Action, a.Content = "accept", c
	return a, nil
}

// inputResponse decodes one response of tasks/update's inputResponses.
func inputResponse(raw json.RawMessage) (mcp.InputResponse, bool) {
	var m mcp.InputResponseMap
	if err := json.Unmarshal(mustMarshal(map[string]json.RawMessage{"r": raw}), &m); err != nil {
		return nil, false
	}
	if e, ok := m["r"].(*mcp.ElicitResult); ok && e.Action == "" {
		return nil, false
	}
	return m["r"], m["r"] != nil
}

// capsOf reads the client capabilities of a request's _meta (a custom method's, which
// go-sdk does not read), roots included (go-sdk's RootsV2, which plain decoding skips).
func capsOf(meta mcp.Meta) *mcp.ClientCapabilities {
	raw, err := json.Marshal(meta[mcp.MetaKeyClientCapabilities])
	var caps *mcp.ClientCapabilities
	if err != nil || json.Unmarshal(raw, &caps) != nil || caps == nil {
		return nil // none: nothing can be asked
	}
	var roots struct {
		Roots *mcp.RootCapabilities `json:"roots"`
	}
	_ = json.Unmarshal(raw, &roots) //nolint:errcheck // decoded above
	caps.RootsV2 = roots.Roots
	return caps
}
