package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	jsval "github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

var printer = message.NewPrinter(language.English)

// parseArguments checks that s is exactly one JSON object and decodes it for schema
// validation (numbers as json.Number). On failure it returns a model-readable message
// and one violation.
func parseArguments(s string) (json.RawMessage, any, string, *Violation) {
	i := skipSpace(s)
	if i == len(s) {
		const msg = "arguments are empty: send the arguments as one JSON object, e.g. {} when the tool needs none"
		return nil, nil, msg, &Violation{Path: "", Message: "empty arguments"}
	}
	b := []byte(s) // one copy: decoded here, then given to the tool
	if s[i] == '{' {
		// The common case in one pass: decoding checks the syntax too.
		if v, err := decodeJSON(b); err == nil {
			return b, v, "", nil
		}
	}
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		var se *json.SyntaxError
		if errors.As(err, &se) {
			// encoding/json counts the offending byte; report its 0-based offset.
			off := se.Offset
			hint := ""
			if off >= int64(len(s)) && strings.Contains(se.Error(), "unexpected end") {
				off = int64(len(s))
				hint = " (the JSON ends early: it looks truncated)"
			} else if off > 0 {
				off--
			}
			msg := fmt.Sprintf("arguments are not valid JSON: %s at byte offset %d%s, near %s; send one complete JSON object with double-quoted keys and no trailing commas",
				se.Error(), off, hint, near(s, int(off)))
			return nil, nil, msg, &Violation{Path: "", Message: se.Error(), Offset: &off}
		}
		msg := "arguments are not valid JSON; send one JSON object"
		if err != nil {
			msg = "arguments are not valid JSON: " + err.Error() + "; send one JSON object"
		}
		return nil, nil, msg, &Violation{Path: "", Message: "not valid JSON"}
	}
	if s[i] != '{' {
		kind := jsonKind(s[i])
		msg := "arguments must be a JSON object ({...} with the parameters as keys), got " + kind
		return nil, nil, msg, &Violation{Path: "", Message: "got " + kind + ", want object"}
	}
	// Valid JSON starting with an object that did not decode: not expected.
	return nil, nil, "arguments are not valid JSON; send one JSON object", &Violation{Path: "", Message: "not valid JSON"}
}

// near shows up to 24 bytes of s before offset (and the byte at it) for a message, in
// backquotes, control characters as spaces.
func near(s string, off int) string {
	end := min(off+1, len(s))
	start := cutAfter(s, max(0, end-24))
	end = cutAfter(s, end)
	snippet := strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s[start:end])
	return "`" + snippet + "`"
}

func skipSpace(b string) int {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func jsonKind(c byte) string {
	switch c {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// violations flattens a schema validation error into one violation per failed leaf,
// sorted by path. With values=false, messages never quote the instance (used for tool
// outputs, which must not leak into the result).
func violations(err error, values bool) []Violation {
	var ve *jsval.ValidationError
	if !errors.As(err, &ve) {
		return []Violation{{Path: "", Message: err.Error()}}
	}
	var out []Violation
	collectViolations(ve, values, &out)
	if len(out) == 0 {
		out = append(out, Violation{Path: "", Message: "does not match the schema"})
	}
	slices.SortStableFunc(out, func(a, b Violation) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Message, b.Message)
	})
	return slices.CompactFunc(out, func(a, b Violation) bool { return a.Path == b.Path && a.Message == b.Message })
}

func collectViolations(ve *jsval.ValidationError, values bool, out *[]Violation) {
	if len(ve.Causes) > 0 {
		for _, c := range ve.Causes {
			collectViolations(c, values, out)
		}
		return
	}
	var msg string
	switch k := ve.ErrorKind.(type) {
	case *kind.Type, *kind.Required, *kind.FalseSchema:
		msg = k.LocalizedString(printer)
	default:
		if values {
			msg = k.LocalizedString(printer)
		} else {
			msg = "does not satisfy " + strconv.Quote(strings.Join(k.KeywordPath(), "/"))
		}
	}
	*out = append(*out, Violation{Path: jsonPointer(ve.InstanceLocation), Message: msg})
}

func jsonPointer(tokens []string) string {
	if len(tokens) == 0 {
		return ""
	}
	var sb strings.Builder
	for _, t := range tokens {
		sb.WriteByte('/')
		if strings.ContainsAny(t, "~/") {
			t = strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
		}
		sb.WriteString(t)
	}
	return sb.String()
}

// violationText renders violations as lines "- <path>: <message>" for a message.
func violationText(vs []Violation) string {
	var sb strings.Builder
	for i, v := range vs {
		if i > 0 {
			sb.WriteByte('\n')
		}
		sb.WriteString("- ")
		if v.Path == "" {
			sb.WriteString("(root)")
		} else {
			sb.WriteString(v.Path)
		}
		sb.WriteString(": ")
		sb.WriteString(v.Message)
	}
	return sb.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
