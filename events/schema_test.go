package events_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/invopop/jsonschema"
	sjs "github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/golden"
)

// schemaDir holds the checked-in JSON Schemas, one per event type (from the events
// package directory).
const schemaDir = "../schemas"

// dataType returns the Go type of the data of events of type typ.
func dataType(t testing.TB, typ string) any {
	switch typ {
	case events.TypeRunStarted:
		return toolbus.RunStarted{}
	case events.TypeModelRequested:
		return toolbus.ModelRequested{}
	case events.TypeModelResponded:
		return toolbus.ModelResponded{}
	case events.TypeToolRequested:
		return toolbus.ToolRequested{}
	case events.TypeToolFinished:
		return toolbus.ToolFinished{}
	case events.TypeToolWaiting:
		return toolbus.ToolWaiting{}
	case events.TypeToolProgress:
		return toolbus.ToolProgress{}
	case events.TypeToolLog:
		return toolbus.ToolLog{}
	case events.TypeToolQuestion:
		return toolbus.ToolQuestion{}
	case events.TypeToolAnswer:
		return toolbus.ToolAnswer{}
	case events.TypeApprovalGranted, events.TypeApprovalDenied:
		return toolbus.Approval{}
	case events.TypeRunCancel:
		return toolbus.Cancel{}
	case events.TypeRunTimer:
		return events.RunTimer{}
	}
	if strings.HasPrefix(typ, "toolbus.run.") {
		return toolbus.RunEnded{}
	}
	t.Fatalf("no Go type for event type %s", typ)
	return nil
}

var (
	statusType    = reflect.TypeFor[toolbus.Status]()
	runStatusType = reflect.TypeFor[toolbus.RunStatus]()
	roleType      = reflect.TypeFor[toolbus.Role]()
)

// enum builds a string schema limited to values.
func enum[T ~string](values ...T) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "string"}
	for _, v := range values {
		s.Enum = append(s.Enum, string(v))
	}
	return s
}

// generateSchemas reflects the schema of every event type's data from the Go types, with
// their doc comments as descriptions. Objects allow additional properties: a subscriber
// validating with v1 must accept fields added later in v1 (adding a field is compatible;
// renaming or removing one is a new version).
func generateSchemas(t testing.TB) map[string][]byte {
	t.Helper()
	r := &jsonschema.Reflector{
		AllowAdditionalProperties: true,
		ExpandedStruct:            true,
		Anonymous:                 true,
		Mapper: func(rt reflect.Type) *jsonschema.Schema {
			switch rt {
			case statusType:
				return enum(toolbus.StatusSucceeded, toolbus.StatusFailed, toolbus.StatusRejected, toolbus.StatusTimedOut, toolbus.StatusCancelled)
			case runStatusType:
				return enum(toolbus.RunRunning, toolbus.RunCompleted, toolbus.RunWaitingForApproval, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled)
			case roleType:
				return enum(toolbus.RoleSystem, toolbus.RoleUser, toolbus.RoleAssistant, toolbus.RoleTool)
			}
			return nil
		},
	}
	// The contract types live in the root package. The comment keys are the base joined
	// with each file's directory, so walking ".." from here with this package as the
	// base keys the root's files as github.com/toolbus/toolbus.
	if err := r.AddGoComments("github.com/toolbus/toolbus/events", ".."); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, typ := range contractTypes(t) {
		s := r.Reflect(dataType(t, typ))
		s.ID = jsonschema.ID(events.DataSchema(typ))
		s.Title = "data of " + typ + " events"
		if status, ok := strings.CutPrefix(typ, "toolbus.run."); ok && (toolbus.RunStatus(status).Terminal() || toolbus.RunStatus(status) == toolbus.RunWaitingForApproval) {
			// One schema per outcome: its status is the outcome of the event type.
			p, _ := s.Properties.Get("status")
			p.Enum = []any{status}
		}
		// Descriptions keep their < and > readable: no HTML escaping in a schema file.
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
		out[events.SchemaFile(typ)] = b.Bytes()
	}
	return out
}

// The checked-in schemas are what the Go types generate; a changed type without
// regenerated schemas fails here. Regenerate with go test ./events -run Schemas -update.
func TestSchemasUpToDate(t *testing.T) {
	gen := generateSchemas(t)
	if golden.Update() {
		if err := os.MkdirAll(schemaDir, 0o755); err != nil {
			t.Fatal(err)
		}
		old, _ := filepath.Glob(filepath.Join(schemaDir, "*.json"))
		for _, p := range old {
			if _, ok := gen[filepath.Base(p)]; !ok {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
			}
		}
		for name, b := range gen {
			if err := os.WriteFile(filepath.Join(schemaDir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(schemaDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range files {
		if _, ok := gen[filepath.Base(p)]; !ok {
			t.Errorf("%s is no event type's schema (go test ./events -run Schemas -update removes it)", p)
		}
	}
	for name, want := range gen {
		got, err := os.ReadFile(filepath.Join(schemaDir, name))
		if err != nil {
			t.Errorf("%v (go test ./events -run Schemas -update)", err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: the Go types changed (go test ./events -run Schemas -update)\n got:\n%s\nwant:\n%s", name, got, want)
		}
	}
}

// loadSchemas compiles every checked-in schema, as a subscriber in another language
// would: by file, resolving each event's dataschema URI to the file of that name.
func loadSchemas(t testing.TB) map[string]*sjs.Schema {
	t.Helper()
	c := sjs.NewCompiler()
	var ids []string
	for _, typ := range contractTypes(t) {
		f, err := os.Open(filepath.Join(schemaDir, events.SchemaFile(typ)))
		if err != nil {
			t.Fatal(err)
		}
		doc, err := sjs.UnmarshalJSON(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		id := events.DataSchema(typ)
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	out := map[string]*sjs.Schema{}
	for _, id := range ids {
		s, err := c.Compile(id)
		if err != nil {
			t.Fatalf("compile %s: %v", id, err)
		}
		out[id] = s
	}
	return out
}

// Every example, encoded by the real encoder, names its schema in dataschema and its
// data validates against that schema.
func TestSchemasValidateEncodedExamples(t *testing.T) {
	schemas := loadSchemas(t)
	for _, e := range examples() {
		t.Run(e.Type, func(t *testing.T) {
			msg := e.encode(t)
			ds := msg.Header.Get("ce-dataschema")
			if want := events.DataSchema(baseType(e.Type)); ds != want {
				t.Fatalf("ce-dataschema %q, want %q", ds, want)
			}
			s, ok := schemas[ds]
			if !ok {
				t.Fatalf("dataschema %s names no file in %s", ds, schemaDir)
			}
			doc, err := sjs.UnmarshalJSON(bytes.NewReader(msg.Data))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Validate(doc); err != nil {
				t.Fatalf("%s data does not validate against %s:\n%s\n%v", e.Type, ds, msg.Data, err)
			}
		})
	}
}

// The schemas reject what a subscriber must not accept, so validating is worth something.
func TestSchemasRejectWrongData(t *testing.T) {
	schemas := loadSchemas(t)
	cases := []struct {
		name, typ, data string
	}{
		{"tool.finished in the old nested shape", events.TypeToolFinished,
			`{"run_id":"r","step":0,"call_index":0,"call_count":1,"result":{"call_id":"c","tool":"t","status":"succeeded","content":"","duration_ms":1}}`},
		{"tool.finished with an unknown status", events.TypeToolFinished,
			`{"run_id":"r","step":0,"call_index":0,"call_count":1,"call_id":"c","tool":"t","status":"exploded","content":"","duration_ms":1}`},
		{"tool.finished with a string step", events.TypeToolFinished,
			`{"run_id":"r","step":"0","call_index":0,"call_count":1,"call_id":"c","tool":"t","status":"succeeded","content":"","duration_ms":1}`},
		{"run.completed carrying another status", events.TypeRunEnded(toolbus.RunCompleted),
			`{"run_id":"r","status":"failed","steps_used":1,"usage":{"input_tokens":1,"output_tokens":1}}`},
		{"tool.requested without its call", events.TypeToolRequested,
			`{"run_id":"r","step":0,"call_index":0,"call_count":1,"principal":{"id":"p"}}`},
		{"model.responded with an unknown role", events.TypeModelResponded,
			`{"run_id":"r","step":0,"message":{"role":"robot"},"usage":{"input_tokens":1,"output_tokens":1},"latency_ms":1}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc, err := sjs.UnmarshalJSON(strings.NewReader(c.data))
			if err != nil {
				t.Fatal(err)
			}
			if err := schemas[events.DataSchema(c.typ)].Validate(doc); err == nil {
				t.Fatalf("%s validated against %s", c.data, events.SchemaFile(c.typ))
			}
		})
	}
	// New fields are compatible within v1: a subscriber's validation must not break.
	doc, _ := sjs.UnmarshalJSON(strings.NewReader(`{"run_id":"r","step":0,"added_later":true}`))
	if err := schemas[events.DataSchema(events.TypeModelRequested)].Validate(doc); err != nil {
		t.Fatalf("an added field fails validation: %v", err)
	}
}
