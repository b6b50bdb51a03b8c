package executor

import (
	"bytes"
	"encoding/json"
	"errors"
)

var errInvalidJSON = errors.New("executor: invalid JSON")

// decodeJSON decodes exactly one JSON value (white space around it, nothing else) into
// map[string]any, []any, string, json.Number, bool or nil (encoding/json with UseNumber,
// so integers keep their exact value for the schema validator).
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	// Only white space may follow the value (Decoder.More would let a closing bracket
	// through).
	for _, c := range b[d.InputOffset():] {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return nil, errInvalidJSON
		}
	}
	return v, nil
}
