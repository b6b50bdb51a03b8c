package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	jsreflect "github.com/invopop/jsonschema"
)

// RegisterFunc registers a typed Go function as tool t.
//
// Unless t.InputSchema is already set, the input schema is derived from In with
// github.com/invopop/jsonschema: everything inlined (no $ref, $defs, $schema or $id, which
// some model APIs refuse), additionalProperties false, a property required when its json
// tag has no omitempty/omitzero, descriptions and constraints from `jsonschema:"..."`
// tags. In must be a struct (or pointer to one) or a map with string keys; recursive
// types are refused, since an inlined schema of them would be infinite.
//
// Unless t.OutputSchema is already set, an output schema is derived from Out the same
// way and published in the contract (e.g. as an MCP outputSchema), but it is not
// enforced: the Go type already guarantees the shape, and nil slices, maps and
// pointers legitimately encode as null where the derived schema does not allow it. An
// output schema set in t is enforced as with Register. No output schema is derived for
// interface types or json.RawMessage.
//
// t.Func is replaced: it decodes the arguments (already validated) into In with
// DisallowUnknownFields, calls fn, and returns its output. Arguments that pass the
// schema but still do not decode give a rejected invalid_arguments result without
// calling fn.
func RegisterFunc[In, Out any](r *Registry, t Tool, fn func(ctx context.Context, in In) (Out, error)) error {
	if fn == nil {
		return invalid(t.Name, "function is nil")
	}
	if len(bytes.TrimSpace(t.InputSchema)) == 0 {
		s, err := deriveSchema(reflect.TypeFor[In]())
		if err != nil {
			return invalid(t.Name, "input type %s: %v", reflect.TypeFor[In](), err)
		}
		t.InputSchema = s
	}
	checkOutput := len(bytes.TrimSpace(t.OutputSchema)) > 0
	if ot := reflect.TypeFor[Out](); !checkOutput && ot != attachedType && ot != reflect.PointerTo(attachedType) {
		if s, err := deriveSchema(ot); err == nil {
			t.OutputSchema = s
		}
	}
	t.Func = func(ctx context.Context, args json.RawMessage) (any, error) {
		var in In
		d := json.NewDecoder(bytes.NewReader(args))
		d.DisallowUnknownFields()
		if err := d.Decode(&in); err != nil {
			return nil, &decodeError{err: err}
		}
		out, err := fn(ctx, in)
		if err != nil {
			return nil, err
		}
		return out, nil
	}
	return r.register(t, checkOutput)
}

var (
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	attachedType   = reflect.TypeFor[Attached]()
	customSchema   = reflect.TypeFor[interface{ JSONSchema() *jsreflect.Schema }]()
)

// deriveSchema reflects t into an inlined JSON Schema.
func deriveSchema(t reflect.Type) (json.RawMessage, error) {
	base := t
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	if base.Kind() == reflect.Interface || base == rawMessageType {
		return nil, fmt.Errorf("no schema can be derived from an interface or json.RawMessage")
	}
	if path := typeCycle(base, nil); path != "" {
		return nil, fmt.Errorf("recursive type (%s): give an explicit schema instead", path)
	}
	rf := &jsreflect.Reflector{DoNotReference: true, Anonymous: true, ExpandedStruct: true}
	s := rf.ReflectFromType(base)
	s.Version = ""
	s.ID = ""
	s.Definitions = nil
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// typeCycle returns a description of a path by which t contains itself, or "".
func typeCycle(t reflect.Type, stack []reflect.Type) string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.Implements(customSchema) || reflect.PointerTo(t).Implements(customSchema) {
		return ""
	}
	for i, s := range stack {
		if s == t {
			names := make([]string, 0, len(stack)-i+1)
			for _, s := range stack[i:] {
				names = append(names, s.String())
			}
			return strings.Join(append(names, t.String()), " -> ")
		}
	}
	stack = append(stack, t)
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		if tag := f.Tag.Get("json"); tag == "-" {
			continue
		}
		if p := typeCycle(f.Type, stack); p != "" {
			return p
		}
	}
	return ""
}
