// Package argcheck checks a call's arguments against a tool's input schema outside the
// executor: a person's edit of a call is checked where the decision is made (the CLI,
// the console) and where it is recorded (the injector), so that an invalid edit is
// refused before it can cost the call.
package argcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	jsval "github.com/santhosh-tekuri/jsonschema/v6"
)

// ErrInvalid is wrapped by Check's errors for arguments the schema refuses.
var ErrInvalid = errors.New("arguments do not match the tool's input schema")

type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external schema reference %q is not allowed", url)
}

// Check returns nil when args is one JSON object valid against schema (an empty schema
// accepts any object), else an error wrapping ErrInvalid that says what is wrong.
func Check(schema json.RawMessage, args string) error {
	v, err := jsval.UnmarshalJSON(strings.NewReader(args))
	if err != nil {
		return fmt.Errorf("%w: not valid JSON: %v", ErrInvalid, err)
	}
	if _, ok := v.(map[string]any); !ok {
		return fmt.Errorf("%w: want one JSON object ({...})", ErrInvalid)
	}
	if len(bytes.TrimSpace(schema)) == 0 {
		return nil
	}
	doc, err := jsval.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return fmt.Errorf("argcheck: the tool's input schema is not valid JSON: %w", err)
	}
	c := jsval.NewCompiler()
	c.UseLoader(refuseLoader{})
	c.AssertFormat()
	const url = "mem:///toolbus/input.schema.json"
	if err := c.AddResource(url, doc); err != nil {
		return fmt.Errorf("argcheck: input schema: %w", err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return fmt.Errorf("argcheck: input schema: %w", err)
	}
	if err := s.Validate(v); err != nil {
		var ve *jsval.ValidationError
		if errors.As(err, &ve) {
			return fmt.Errorf("%w: %s", ErrInvalid, oneLine(ve.Error()))
		}
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
