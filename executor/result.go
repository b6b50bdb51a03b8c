package executor

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/toolbus/toolbus"
)

// maxDetailsBytes bounds ToolResult.Error.Details; larger details are dropped (the
// message still says what went wrong).
const maxDetailsBytes = 64 << 10

var nullJSON = json.RawMessage("null")

// output fills a succeeded result from a Func's output, or an invalid_tool_output
// failure.
func (c *call) output(out any) {
	switch x := out.(type) {
	case Attached:
		c.output(x.Output)
		if c.res.Status == toolbus.StatusSucceeded {
			c.attach(x.Files)
		}
	case *Attached:
		if x == nil {
			c.succeed(nullJSON, "null", 0)
			return
		}
		c.output(*x)
	case nil:
		c.succeed(nullJSON, "null", 0)
	case string:
		if c.ent.out != nil {
			if err := c.ent.out.Validate(x); err != nil {
				c.invalidOutput(violations(err, false))
				return
			}
		}
		c.text(x)
	case json.RawMessage:
		if len(bytes.TrimSpace(x)) == 0 {
			c.succeed(nullJSON, "null", 0)
			return
		}
		if !json.Valid(x) {
			c.fail(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput,
				"the tool returned an invalid output (not valid JSON)", false, nil)
			return
		}
		c.structured(x)
	default:
		b, err := marshalJSON(out)
		if err != nil {
			c.e.log.Warn("executor: tool output cannot be encoded as JSON",
				"call_id", c.res.CallID, "tool", c.ent.tool.Name, "error", err)
			c.fail(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput,
				"the tool returned an invalid output (it cannot be encoded as JSON)", false, nil)
			return
		}
		c.structured(b)
	}
}

// structured handles a JSON output: schema check, redaction, canonical re-encoding.
func (c *call) structured(b []byte) {
	v, err := decodeJSON(b)
	if err != nil {
		c.fail(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput,
			"the tool returned an invalid output (not valid JSON)", false, nil)
		return
	}
	if v == nil { // null is an empty result
		c.succeed(nullJSON, "null", 0)
		return
	}
	if c.ent.out != nil {
		if err := c.ent.out.Validate(v); err != nil {
			c.invalidOutput(violations(err, false))
			return
		}
	}
	if s, ok := v.(string); ok {
		c.text(s)
		return
	}
	v, n := redactValue(v, c.ent.redact, c.e.secretValues())
	v, m := c.e.secretValues().split(v)
	n += m
	canon := appendCanonical(make([]byte, 0, len(b)+len(b)/8), v)
	c.succeed(canon, string(canon), n)
}

// text handles a string output: the text itself is the content.
func (c *call) text(s string) {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	s, n := c.e.secretValues().text(s)
	c.succeed(appendJSONString(make([]byte, 0, len(s)+2), s), s, n)
}

func (c *call) succeed(output json.RawMessage, content string, redactions int) {
	r := c.res
	r.Status = toolbus.StatusSucceeded
	r.Output = output
	r.Redactions += redactions
	if len(content) > c.maxOut {
		t, kept := TruncateText(content, c.maxOut)
		r.Truncated = &toolbus.Truncation{OriginalBytes: len(content), KeptBytes: kept}
		content = t
	}
	r.Content = content
}

func (c *call) invalidOutput(vs []Violation) {
	c.fail(toolbus.StatusFailed, toolbus.CodeInvalidToolOutput,
		"the tool returned an invalid output: it does not match the tool's output schema ("+
			plural(len(vs), "violation", "violations")+"):\n"+violationText(vs),
		false, vs)
}

// fail fills a non-succeeded result. The message is redacted and bounded so that the
// content, {"error":{"code":...,"message":...,"retryable":...}}, fits in maxOut.
func (c *call) fail(status toolbus.Status, code, msg string, retryable bool, details any) {
	r := c.res
	r.Status = status
	r.Output = nil
	msg, n := c.e.secretValues().text(stripStack(msg))
	r.Redactions += n
	var keys []string
	if c.ent != nil {
		keys = c.ent.redact
	}
	te := &toolbus.ToolError{Code: code, Retryable: retryable}
	if details != nil {
		if b, err := marshalJSON(details); err == nil {
			if v, err := decodeJSON(b); err == nil && v != nil {
				v, n := redactValue(v, keys, c.e.secretValues())
				v, m := c.e.secretValues().split(v)
				n += m
				if b := appendCanonical(nil, v); len(b) <= maxDetailsBytes {
					te.Details = b
					r.Redactions += n
				}
			}
		}
	}
	content := errorContent(code, msg, retryable)
	m := msg
	if len(content) > c.maxOut {
		// Shrink the raw message in proportion to how much JSON escaping grows it.
		envelope := len(errorContent(code, "", retryable))
		budget := c.maxOut - envelope
		for i := 0; i < 8 && len(content) > c.maxOut && budget > 0; i++ {
			escaped := len(content) - envelope
			want := int(int64(len(m)) * int64(budget) / int64(escaped))
			if want >= len(m) {
				want = len(m) - 1
			}
			m, _ = TruncateText(msg, want)
			content = errorContent(code, m, retryable)
		}
	}
	if len(content) > c.maxOut {
		content = content[:cutBefore(string(content), c.maxOut)]
	}
	te.Message = m
	r.Error = te
	r.Content = string(content)
}

func errorContent(code, msg string, retryable bool) []byte {
	b := make([]byte, 0, len(code)+len(msg)+56)
	b = append(b, `{"error":{"code":`...)
	b = appendJSONString(b, code)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"retryable":`...)
	b = strconv.AppendBool(b, retryable)
	b = append(b, `}}`...)
	return b
}

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
