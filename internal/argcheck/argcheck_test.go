package argcheck_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/toolbus/toolbus/internal/argcheck"
)

func TestCheck(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"service":{"type":"string"}},"required":["service"],"additionalProperties":false}`)
	for _, tc := range []struct {
		args string
		ok   bool
	}{
		{`{"service":"web"}`, true},
		{`{"service":1}`, false},
		{`{}`, false},
		{`{"service":"web","x":1}`, false},
		{`[1]`, false},
		{`{"service":`, false},
	} {
		err := argcheck.Check(schema, tc.args)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, argcheck.ErrInvalid)) {
			t.Errorf("Check(%s) = %v, want ok=%v", tc.args, err, tc.ok)
		}
	}
	if err := argcheck.Check(nil, `{"a":1}`); err != nil {
		t.Errorf("empty schema: %v", err)
	}
}
