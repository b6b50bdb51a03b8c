package executor

import (
	"github.com/toolbus/toolbus"
)

// ErrorResult builds the result of a call stopped outside Execute (for example by the
// bus worker: a tool not allowed in the run, an approval denied, a call of an ended run,
// a call whose executor crashed on every delivery), with the same bounded error content
// as Execute produces. The error is not retryable.
func ErrorResult(tc toolbus.ToolCall, status toolbus.Status, code, msg string) toolbus.ToolResult {
	res := toolbus.ToolResult{CallID: tc.CallID, Tool: tc.Tool, Attempt: 1}
	c := call{res: &res, maxOut: DefaultMaxOutputBytes}
	c.fail(status, code, msg, false, nil)
	return res
}
