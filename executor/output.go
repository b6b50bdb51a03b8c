package executor

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
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

// marshalJSON encodes v compactly without HTML escaping (content is for a model, not a
// browser).
func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// appendCanonical appends the canonical JSON of a decoded value (map[string]any,
// []any, string, json.Number, bool, nil; see decodeJSON): compact, object keys
// sorted, strings escaped by appendJSONString, numbers as written.
func appendCanonical(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		return strconv.AppendBool(b, x)
	case json.Number:
		return append(b, x...)
	case string:
		return appendJSONString(b, x)
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCanonical(b, e)
		}
		return append(b, ']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendCanonical(b, x[k])
		}
		return append(b, '}')
	}
	// Not produced by decodeJSON; encode it the standard way.
	if enc, err := marshalJSON(v); err == nil {
		return append(b, enc...)
	}
	return append(b, "null"...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string: quotes, backslashes and control
// characters escaped, invalid UTF-8 replaced by U+FFFD, no HTML escaping.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// stackRE finds the start of a Go stack trace: a goroutine header or a file:line frame.
var stackRE = regexp.MustCompile(`goroutine \d+ \[[^\]\n]*\]:|[^\s"'()]+\.go:\d+`)

// stripStack cuts a message at the first sign of a stack trace (some errors carry one in
// their text); stacks belong in logs, never in what the model reads.
func stripStack(msg string) string {
	if !strings.Contains(msg, "goroutine ") && !strings.Contains(msg, ".go:") {
		return msg
	}
	loc := stackRE.FindStringIndex(msg)
	if loc == nil {
		return msg
	}
	return strings.TrimRight(msg[:loc[0]], " \t\n:") + " [stack trace removed]"
}
