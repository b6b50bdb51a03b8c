package executor

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
	"unsafe"
)

// validJSON reports whether s is one valid JSON value (encoding/json's rules), without
// copying s.
func validJSON(s string) bool {
	return json.Valid(unsafe.Slice(unsafe.StringData(s), len(s)))
}

var errInvalidJSON = errors.New("executor: invalid JSON")

// decodeJSON decodes one JSON value into map[string]any, []any, string, json.Number,
// bool or nil, as encoding/json with UseNumber would.
func decodeJSON(b []byte) (any, error) {
	if !json.Valid(b) {
		return nil, errInvalidJSON
	}
	return parseValidJSON(string(b)), nil
}

// parseValidJSON decodes s, which must already have passed json.Valid, like
// encoding/json with UseNumber would: objects as map[string]any (the last duplicate key
// wins), arrays as []any, numbers as json.Number. Strings without escapes share s's
// memory, so the common case allocates only the maps and slices.
func parseValidJSON(s string) any {
	p := jsonParser{s: s}
	return p.value()
}

type jsonParser struct {
	s string
	i int
}

func (p *jsonParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value() any {
	p.ws()
	switch p.s[p.i] {
	case '{':
		return p.object()
	case '[':
		return p.array()
	case '"':
		return p.str()
	case 't':
		p.i += 4
		return true
	case 'f':
		p.i += 5
		return false
	case 'n':
		p.i += 4
		return nil
	default:
		start := p.i
		for p.i < len(p.s) {
			c := p.s[p.i]
			if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
				p.i++
				continue
			}
			break
		}
		return json.Number(p.s[start:p.i])
	}
}

func (p *jsonParser) object() map[string]any {
	p.i++ // {
	m := make(map[string]any)
	p.ws()
	if p.s[p.i] == '}' {
		p.i++
		return m
	}
	for {
		p.ws()
		k := p.str()
		p.ws()
		p.i++ // :
		m[k] = p.value()
		p.ws()
		c := p.s[p.i]
		p.i++ // , or }
		if c != ',' {
			return m
		}
	}
}

func (p *jsonParser) array() []any {
	p.i++ // [
	a := []any{}
	p.ws()
	if p.s[p.i] == ']' {
		p.i++
		return a
	}
	for {
		a = append(a, p.value())
		p.ws()
		c := p.s[p.i]
		p.i++ // , or ]
		if c != ',' {
			return a
		}
	}
}

func (p *jsonParser) str() string {
	start := p.i // the opening quote
	p.i++
	simple := true
	for {
		c := p.s[p.i]
		if c == '"' {
			break
		}
		if c == '\\' {
			simple = false
			p.i += 2
			continue
		}
		if c >= utf8.RuneSelf {
			simple = false
		}
		p.i++
	}
	p.i++ // closing quote
	raw := p.s[start:p.i]
	body := raw[1 : len(raw)-1]
	if simple || (!hasByte(body, '\\') && utf8.ValidString(body)) {
		return body
	}
	var out string
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return body // cannot happen for valid JSON
	}
	return out
}

func hasByte(s string, c byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return true
		}
	}
	return false
}
