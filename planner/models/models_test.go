package models

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/anthropic"
	"github.com/toolbus/toolbus/planner/openai"
)

const incidentCassette = "../testdata/incident.jsonl"

// testOptions build models quietly, with one more built-in script (noop).
var testOptions = Options{Logger: slog.New(slog.DiscardHandler), Scripts: map[string]func() planner.Model{
	"noop": func() planner.Model { return planner.ModelFunc(nil) },
}}

func TestNewModelKinds(t *testing.T) {
	for _, k := range []string{"OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"} {
		t.Setenv(k, "")
	}
	tests := []struct {
		model   string
		env     map[string]string
		want    any
		wantErr string
	}{
		{model: "script:incident", want: &planner.Script{}},
		{model: "script:noop", want: planner.ModelFunc(nil)},
		{model: "script:nope", wantErr: "unknown script \"nope\": not a built-in script (incident, approval, noop)"},
		{model: "replay:" + incidentCassette, want: &planner.Replay{}},
		{model: "replay:", wantErr: "needs a cassette file"},
		{model: "replay:/does/not/exist.jsonl", wantErr: "planner: replay"},
		{model: "openai:gpt-4.1", env: map[string]string{"OPENAI_API_KEY": "k"}, want: &openai.Chat{}},
		{model: "openai:qwen3", env: map[string]string{"OPENAI_BASE_URL": "http://localhost:11434/v1"}, want: &openai.Chat{}},
		{model: "openai:gpt-4.1", wantErr: "needs OPENAI_API_KEY"},
		{model: "openai:", env: map[string]string{"OPENAI_API_KEY": "k"}, wantErr: "needs a model name"},
		{model: "openai-responses:gpt-5", env: map[string]string{"OPENAI_API_KEY": "k"}, want: &openai.Responses{}},
		{model: "anthropic:claude-sonnet-4-5", env: map[string]string{"ANTHROPIC_API_KEY": "k"}, want: &anthropic.Messages{}},
		{model: "anthropic:claude-sonnet-4-5", wantErr: "needs ANTHROPIC_API_KEY"},
		{model: "anthropic:", wantErr: "needs a model name"},
		{model: "gemini:flash", wantErr: `unknown model "gemini:flash"`},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			m, err := New(tt.model, testOptions)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if reflect.TypeOf(m) != reflect.TypeOf(tt.want) {
				t.Fatalf("model %T, want %T", m, tt.want)
			}
		})
	}
}

func TestNewModelRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	o := testOptions
	o.Record = path
	m, err := New("script:incident", o)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.(*planner.Recorder); !ok {
		t.Fatalf("model %T, want a recorder", m)
	}
	req := planner.Request{RunID: "r", Step: 0, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}}
	if _, err := m.Complete(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ex planner.Exchange
	if err := json.Unmarshal(b, &ex); err != nil || ex.RunID != "r" || len(ex.Response.Message.ToolCalls) != 2 {
		t.Fatalf("recorded %s (%v)", b, err)
	}
}

// TestIncidentCassetteMatchesScript keeps planner/testdata/incident.jsonl the recording
// of the demo's scripted model: every recorded request, asked again of IncidentScript,
// gets the recorded answer. Regenerate the cassette (from the repository root) with
//
//	rm planner/testdata/incident.jsonl
//	TOOLBUS_DATA_DIR=$(mktemp -d) TOOLBUS_MODEL=script:incident TOOLBUS_RECORD=planner/testdata/incident.jsonl \
//	  go run ./cmd/toolbus run --id demo-incident "What is going on with INC-404?"
func TestIncidentCassetteMatchesScript(t *testing.T) {
	f, err := os.Open(incidentCassette)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	script := IncidentScript()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		var ex planner.Exchange
		if err := json.Unmarshal(sc.Bytes(), &ex); err != nil {
			t.Fatal(err)
		}
		resp, err := script.Complete(context.Background(), planner.Request{
			RunID: ex.RunID, Step: ex.Step, Model: ex.Request.Model, Messages: ex.Request.Messages, Tools: ex.Request.Tools})
		if err != nil {
			t.Fatal(err)
		}
		got := planner.ExchangeResponse{Message: resp.Message, Usage: resp.Usage, Model: resp.Model}
		if !reflect.DeepEqual(got, ex.Response) {
			t.Fatalf("step %d: the script answers\n%+v\nthe cassette holds\n%+v", ex.Step, got, ex.Response)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("%d exchanges, want the 3 steps of the demo", n)
	}
}

// A script file of the client's host travels with the run (Ship): the model name carries
// the script, and a planner with no such file serves it; a file over the bound is
// refused saying why; other names are left to the planner.
func TestShipScriptFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "greet.json")
	script := `{"steps": [{"say": "hi", "calls": [{"id": "g", "tool": "greet", "arguments": {"name": "Ada"}}]}, {"say": "done"}]}`
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	shipped, err := Ship("script:" + path)
	if err != nil {
		t.Fatal(err)
	}
	if !planner.IsInlineScript(shipped) || !strings.Contains(shipped, `"name":"script:greet"`) {
		t.Fatalf("Ship = %q, want the script itself, named", shipped)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	set := NewSet("script:incident", planner.ModelFunc(nil), testOptions)
	m, err := set.Resolve(shipped)
	if err != nil {
		t.Fatalf("a planner without the file: %v", err)
	}
	resp, err := m.Complete(context.Background(), planner.Request{RunID: "r", Step: 0})
	if err != nil || len(resp.Message.ToolCalls) != 1 || resp.Message.ToolCalls[0].Tool != "greet" || resp.Model != "script:greet" {
		t.Fatalf("the shipped script answered %+v, %v", resp, err)
	}

	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, []byte(`{"steps": [{"say": "`+strings.Repeat("x", planner.MaxInlineScript)+`"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Ship("script:" + big); err == nil || !strings.Contains(err.Error(), "over the 65536 a run may carry") {
		t.Fatalf("Ship of a script over the bound: %v", err)
	}
	if _, err := set.Resolve("script:{" + strings.Repeat(" ", planner.MaxInlineScript) + "}"); err == nil {
		t.Fatal("a planner served a run's script over the bound")
	}
	for _, name := range []string{"script:incident", "openai:gpt-4.1", "script:" + filepath.Join(dir, "missing.json"), ""} {
		if got, err := Ship(name); err != nil || got != name {
			t.Errorf("Ship(%q) = %q, %v; want it unchanged", name, got, err)
		}
	}
}
