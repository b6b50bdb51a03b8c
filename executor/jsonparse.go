package executor

import (
	"bytes"
	"encoding/json"
	"errors"
)

var errInvalidJSON = errors.New("executor: invalid JSON")

// decodeJSON decodes one JSON value into map[string]any, []any, string, json.Number,
// bool or nil (encoding/json with UseNumber, so integers keep their exact value for the
// schema validator).
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errInvalidJSON
	}
	return v, nil
}
