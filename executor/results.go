package executor

import "github.com/toolbus/toolbus/events"

// rejectedResult builds a rejected result for a call stopped outside Execute (for
// example by the bus worker: a tool not allowed in the run, an approval denied), with
// the same redacted, bounded error content as Execute produces.
func rejectedResult(tc events.ToolCall, code, msg string) events.ToolResult {
	return errorResult(tc, events.StatusRejected, code, msg)
}

// failedResult builds a failed (non-retryable) result for a call that ended outside
// Execute (for example a call whose executor crashed on every delivery).
func failedResult(tc events.ToolCall, code, msg string) events.ToolResult {
	return errorResult(tc, events.StatusFailed, code, msg)
}

func errorResult(tc events.ToolCall, status events.Status, code, msg string) events.ToolResult {
	res := events.ToolResult{CallID: tc.CallID, Tool: tc.Tool, Attempt: 1}
	c := call{res: &res, maxOut: DefaultMaxOutputBytes}
	c.fail(status, code, msg, false, nil)
	return res
}
