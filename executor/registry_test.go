package executor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/golden"
	"github.com/toolbus/toolbus/internal/testutil"
)

func noop(context.Context, json.RawMessage) (any, error) { return nil, nil }

func TestRegisterRejectsInvalidTools(t *testing.T) {
	obj := json.RawMessage(emptySchema)
	tests := []struct {
		name string
		tool executor.Tool
	}{
		{"empty name", executor.Tool{Name: "", InputSchema: obj, Func: noop}},
		{"space in name", executor.Tool{Name: "my tool", InputSchema: obj, Func: noop}},
		{"dot in name", executor.Tool{Name: "a.b", InputSchema: obj, Func: noop}},
		{"65 chars", executor.Tool{Name: strings.Repeat("a", 65), InputSchema: obj, Func: noop}},
		{"unicode name", executor.Tool{Name: "héllo", InputSchema: obj, Func: noop}},
		{"nil func", executor.Tool{Name: "ok", InputSchema: obj}},
		{"no schema", executor.Tool{Name: "ok", Func: noop}},
		{"schema not JSON", executor.Tool{Name: "ok", InputSchema: json.RawMessage(`{"type":`), Func: noop}},
		{"schema does not compile", executor.Tool{Name: "ok", InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"strin"}}}`), Func: noop}},
		{"schema bad regexp", executor.Tool{Name: "ok", InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"pattern":"("}}}`), Func: noop}},
		{"schema not an object type", executor.Tool{Name: "ok", InputSchema: json.RawMessage(`{"type":"string"}`), Func: noop}},
		{"schema remote ref", executor.Tool{Name: "ok", InputSchema: json.RawMessage(`{"type":"object","$ref":"https://example.com/s.json"}`), Func: noop}},
		{"schema file ref", executor.Tool{Name: "ok", InputSchema: json.RawMessage(`{"type":"object","$ref":"file:///etc/passwd"}`), Func: noop}},
		{"output schema does not compile", executor.Tool{Name: "ok", InputSchema: obj, OutputSchema: json.RawMessage(`{"type":5}`), Func: noop}},
		{"negative timeout", executor.Tool{Name: "ok", InputSchema: obj, Func: noop, Timeout: -time.Second}},
		{"negative concurrency", executor.Tool{Name: "ok", InputSchema: obj, Func: noop, MaxConcurrency: -1}},
		{"tiny output bound", executor.Tool{Name: "ok", InputSchema: obj, Func: noop, MaxOutputBytes: 10}},
		{"empty redact field", executor.Tool{Name: "ok", InputSchema: obj, Func: noop, RedactFields: []string{""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := executor.NewRegistry()
			err := r.Register(tt.tool)
			if !errors.Is(err, executor.ErrInvalidTool) || !strings.HasPrefix(err.Error(), "executor: ") {
				t.Fatalf("Register = %v, want ErrInvalidTool", err)
			}
			if len(r.Names()) != 0 {
				t.Errorf("invalid tool registered: %v", r.Names())
			}
		})
	}
}

func TestRegistry(t *testing.T) {
	r := executor.NewRegistry()
	for _, name := range []string{"b_tool", "a-tool", "C9"} {
		if err := r.Register(executor.Tool{Name: name, Description: "does " + name, InputSchema: json.RawMessage(emptySchema),
			Func: noop, ReadOnly: name == "C9", Timeout: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	err := r.Register(executor.Tool{Name: "a-tool", InputSchema: json.RawMessage(emptySchema), Func: noop})
	if !errors.Is(err, executor.ErrDuplicateTool) || errors.Is(err, executor.ErrInvalidTool) || !strings.HasPrefix(err.Error(), "executor: ") {
		t.Fatalf("duplicate: %v", err)
	}
	if got := r.Names(); !slices.Equal(got, []string{"C9", "a-tool", "b_tool"}) {
		t.Errorf("Names = %v", got)
	}
	if _, ok := r.Lookup("A-tool"); ok {
		t.Error("Lookup is not exact")
	}
	if _, ok := r.Lookup(""); ok {
		t.Error("Lookup of empty name found a tool")
	}
	tool, ok := r.Lookup("a-tool")
	if !ok || tool.Name != "a-tool" || tool.Func == nil {
		t.Fatalf("Lookup = %+v, %v", tool, ok)
	}
	cs := r.Contracts()
	if len(cs) != 3 || cs[0].Name != "C9" || !cs[0].ReadOnly || cs[1].Description != "does a-tool" || cs[1].Timeout != time.Second {
		t.Errorf("Contracts = %+v", cs)
	}

	// The model API shapes accept the contracts as they are.
	oa := toolbus.OpenAITools(cs)
	an := toolbus.AnthropicTools(cs)
	mcp := toolbus.MCPTools(cs)
	if len(oa) != 3 || oa[1].Function.Name != "a-tool" || !json.Valid(oa[1].Function.Parameters) ||
		len(an) != 3 || an[2].Name != "b_tool" || len(mcp) != 3 || !mcp[0].Annotations.ReadOnlyHint {
		t.Errorf("exports: %+v %+v %+v", oa, an, mcp)
	}
	for _, v := range []any{oa, an, mcp} {
		if _, err := json.Marshal(v); err != nil {
			t.Error(err)
		}
	}

	// Registration copies the schema: the caller may reuse its buffer.
	buf := []byte(emptySchema)
	if err := r.Register(executor.Tool{Name: "copy", InputSchema: buf, Func: noop}); err != nil {
		t.Fatal(err)
	}
	copy(buf, strings.Repeat("x", len(buf)))
	if tool, _ := r.Lookup("copy"); string(tool.InputSchema) != emptySchema {
		t.Errorf("registry shares the caller's schema buffer: %s", tool.InputSchema)
	}

	// The zero Registry works, and concurrent reads are safe.
	var zero executor.Registry
	if err := zero.Register(executor.Tool{Name: "z", InputSchema: json.RawMessage(emptySchema), Func: noop}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				zero.Lookup("z")
				zero.Names()
				zero.Contracts()
			}
		})
	}
	wg.Go(func() {
		for i := range 20 {
			_ = zero.Register(executor.Tool{Name: "c" + strings.Repeat("x", i+1), InputSchema: json.RawMessage(emptySchema), Func: noop})
		}
	})
	wg.Wait()
}

func TestToolContract(t *testing.T) {
	tool := executor.Tool{Name: "n", Description: "d", InputSchema: json.RawMessage(emptySchema),
		OutputSchema: json.RawMessage(`{"type":"string"}`), ReadOnly: true, NeedsApproval: true, Timeout: 2 * time.Second,
		MaxOutputBytes: 1000, MaxConcurrency: 3, RedactFields: []string{"password"}, Func: noop}
	c := tool.Contract()
	want := toolbus.ToolContract{Name: "n", Description: "d", InputSchema: tool.InputSchema, OutputSchema: tool.OutputSchema,
		ReadOnly: true, NeedsApproval: true, Timeout: 2 * time.Second, MaxOutputBytes: 1000, MaxConcurrency: 3,
		RedactFields: []string{"password"}}
	gotJSON, _ := json.Marshal(c)
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("Contract = %s, want %s", gotJSON, wantJSON)
	}
}

// Types for the RegisterFunc schema golden file.
type searchIn struct {
	Query    string            `json:"query" jsonschema:"description=Full-text query,minLength=1"`
	Limit    int               `json:"limit,omitempty" jsonschema:"minimum=1,maximum=100,default=10"`
	Since    time.Time         `json:"since,omitzero" jsonschema:"description=Only results after this time"`
	Severity string            `json:"severity,omitempty" jsonschema:"enum=low,enum=high"`
	Filter   *searchFilter     `json:"filter,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Tags     []string          `json:"tags"`
	internal int
}

type searchFilter struct {
	Service string   `json:"service"`
	Hosts   []string `json:"hosts,omitempty"`
}

type searchOut struct {
	Total int          `json:"total"`
	Items []searchItem `json:"items"`
}

type searchItem struct {
	ID    string `json:"id"`
	Title string `json:"title"`
}

func TestRegisterFuncSchemas(t *testing.T) {
	r := executor.NewRegistry()
	var gotIn searchIn
	err := executor.RegisterFunc(r, executor.Tool{Name: "search", Description: "Search incidents.", ReadOnly: true},
		func(_ context.Context, in searchIn) (searchOut, error) {
			gotIn = in
			return searchOut{Total: 1, Items: []searchItem{{ID: "INC-1", Title: in.Query}}}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := r.Lookup("search")
	var both bytes.Buffer
	for _, s := range []json.RawMessage{tool.InputSchema, tool.OutputSchema} {
		if err := json.Indent(&both, s, "", "  "); err != nil {
			t.Fatal(err)
		}
		both.WriteByte('\n')
	}
	golden.Check(t, filepath.Join("testdata", "registerfunc_schemas.golden.json"), both.Bytes())
	for _, bad := range []string{"$ref", "$defs", "$schema", "$id", "definitions"} {
		if bytes.Contains(tool.InputSchema, []byte(bad)) || bytes.Contains(tool.OutputSchema, []byte(bad)) {
			t.Errorf("derived schema has %s", bad)
		}
	}

	ex := testutil.Must(executor.New(r))
	res := ex.Execute(context.Background(), call("search", `{"query":"db","tags":[],"filter":{"service":"auth"},"since":"2024-01-02T03:04:05Z"}`), principal)
	if res.Status != toolbus.StatusSucceeded || res.Content != `{"items":[{"id":"INC-1","title":"db"}],"total":1}` {
		t.Fatalf("%+v", res)
	}
	if gotIn.Query != "db" || gotIn.Filter == nil || gotIn.Filter.Service != "auth" || gotIn.Since.Year() != 2024 {
		t.Errorf("decoded input %+v", gotIn)
	}
	for _, args := range []string{
		`{"tags":[]}`,                              // query required
		`{"query":"db"}`,                           // tags required (no omitempty)
		`{"query":"db","tags":[],"extra":1}`,       // additionalProperties false
		`{"query":"db","tags":[],"limit":0}`,       // minimum
		`{"query":"db","tags":[],"severity":"x"}`,  // enum
		`{"query":"db","tags":[],"since":"today"}`, // format date-time is asserted
		`{"query":"db","tags":[],"filter":{}}`,     // nested required
	} {
		gotIn = searchIn{}
		res := ex.Execute(context.Background(), call("search", args), principal)
		if res.Status != toolbus.StatusRejected || res.Code() != toolbus.CodeInvalidArguments || gotIn.Query != "" {
			t.Errorf("%s: %s %s: %s", args, res.Status, res.Code(), res.Content)
		}
	}
}

func TestRegisterFuncEdgeCases(t *testing.T) {
	r := executor.NewRegistry()
	type recursive struct {
		Name     string       `json:"name"`
		Children []*recursive `json:"children"`
	}
	err := executor.RegisterFunc(r, executor.Tool{Name: "rec"}, func(context.Context, recursive) (any, error) { return nil, nil })
	if !errors.Is(err, executor.ErrInvalidTool) || !strings.Contains(err.Error(), "recursive") {
		t.Errorf("recursive input: %v", err)
	}
	err = executor.RegisterFunc(r, executor.Tool{Name: "str"}, func(context.Context, string) (any, error) { return nil, nil })
	if !errors.Is(err, executor.ErrInvalidTool) {
		t.Errorf("string input: %v", err)
	}
	err = executor.RegisterFunc[struct{}, any](r, executor.Tool{Name: "nilfn"}, nil)
	if !errors.Is(err, executor.ErrInvalidTool) {
		t.Errorf("nil function: %v", err)
	}
	// A recursive output gets no schema but registers; an explicit input schema is kept.
	err = executor.RegisterFunc(r, executor.Tool{Name: "tree", InputSchema: json.RawMessage(`{"type":"object","properties":{"depth":{"type":"integer"}}}`)},
		func(_ context.Context, in map[string]int) (*recursive, error) {
			if in["depth"] == 0 {
				return nil, nil // a nil pointer is an empty result
			}
			return &recursive{Name: "root"}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := r.Lookup("tree")
	if tool.OutputSchema != nil || !strings.Contains(string(tool.InputSchema), "depth") {
		t.Errorf("tree schemas: in %s out %s", tool.InputSchema, tool.OutputSchema)
	}
	ex := testutil.Must(executor.New(r))
	if res := ex.Execute(context.Background(), call("tree", `{"depth":0}`), principal); res.Status != toolbus.StatusSucceeded || res.Content != "null" {
		t.Errorf("nil pointer output: %+v", res)
	}
	if res := ex.Execute(context.Background(), call("tree", `{"depth":1}`), principal); res.Content != `{"children":null,"name":"root"}` {
		t.Errorf("output: %+v", res)
	}

	// Arguments that pass the schema but do not decode are rejected, fn does not run.
	ran := false
	err = executor.RegisterFunc(r, executor.Tool{Name: "small", InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)},
		func(_ context.Context, in struct {
			N int8 `json:"n"`
		}) (int, error) {
			ran = true
			return int(in.N), nil
		})
	if err != nil {
		t.Fatal(err)
	}
	res := ex.Execute(context.Background(), call("small", `{"n":1000}`), principal)
	if res.Status != toolbus.StatusRejected || res.Code() != toolbus.CodeInvalidArguments || ran {
		t.Errorf("overflow: %+v ran=%v", res, ran)
	}
	res = ex.Execute(context.Background(), call("small", `{"n":7,"other":1}`), principal)
	if res.Status != toolbus.StatusRejected || !strings.Contains(res.Error.Message, "unknown field") || ran {
		t.Errorf("unknown field: %+v ran=%v", res, ran)
	}
	if res = ex.Execute(context.Background(), call("small", `{"n":7}`), principal); res.Content != "7" || !ran {
		t.Errorf("small: %+v", res)
	}

	// An explicit output schema is enforced.
	err = executor.RegisterFunc(r, executor.Tool{Name: "checked", OutputSchema: json.RawMessage(`{"type":"object","required":["id"]}`)},
		func(context.Context, struct{}) (map[string]string, error) { return map[string]string{"name": "x"}, nil })
	if err != nil {
		t.Fatal(err)
	}
	if res := ex.Execute(context.Background(), call("checked", `{}`), principal); res.Code() != toolbus.CodeInvalidToolOutput {
		t.Errorf("checked: %+v", res)
	}
	// Typed errors pass through.
	err = executor.RegisterFunc(r, executor.Tool{Name: "typed_err"},
		func(context.Context, struct{}) (struct{}, error) {
			return struct{}{}, executor.NewRetryableError("busy", "try later")
		})
	if err != nil {
		t.Fatal(err)
	}
	if res := ex.Execute(context.Background(), call("typed_err", `{}`), principal); res.Code() != "busy" || !res.Error.Retryable {
		t.Errorf("typed_err: %+v", res)
	}
	// Duplicate via RegisterFunc.
	err = executor.RegisterFunc(r, executor.Tool{Name: "small"}, func(context.Context, struct{}) (int, error) { return 0, nil })
	if !errors.Is(err, executor.ErrDuplicateTool) {
		t.Errorf("duplicate: %v", err)
	}
}

func TestErrorType(t *testing.T) {
	e := executor.NewError("not_found", "no such thing")
	if e.Error() != "not_found: no such thing" || e.Retryable {
		t.Errorf("%v %v", e, e.Retryable)
	}
	if r := executor.NewRetryableError("busy", "later"); !r.Retryable || r.Code != "busy" {
		t.Errorf("%+v", r)
	}
	if (&executor.Error{Message: "m"}).Error() != "m" {
		t.Error("empty code")
	}
}
