package planner_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/planner"
)

// echoModel answers step s of run r with "r/s" and one call whose id is shared by all
// answers, so a caller that mutates the calls would show up.
var echoModel = planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
	return planner.Response{
		Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: fmt.Sprintf("%s/%d", req.RunID, req.Step),
			ToolCalls: []toolbus.ToolCall{{CallID: "c", Tool: "noop", Arguments: `{}`}}},
		Usage: toolbus.Usage{InputTokens: int64(req.Step + 1), OutputTokens: 1}, Model: "echo",
	}, nil
})

func readCassette(t *testing.T, path string) []planner.Exchange {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []planner.Exchange
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ex planner.Exchange
		if err := json.Unmarshal(sc.Bytes(), &ex); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, ex)
	}
	return out
}

func TestRecorderConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.jsonl")
	rec, err := planner.OpenRecorder(echoModel, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := []toolbus.ToolContract{{Name: "noop", InputSchema: json.RawMessage(`{"type":"object"}`)}}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			req := planner.Request{RunID: fmt.Sprintf("run-%d", i%8), Step: i / 8, Model: "m",
				Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: strings.Repeat("x", 5000)}}, Tools: tools}
			if _, err := rec.Complete(context.Background(), req); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	exs := readCassette(t, path)
	if len(exs) != 40 {
		t.Fatalf("%d lines, want 40", len(exs))
	}
	seen := map[string]bool{}
	for _, ex := range exs {
		key := fmt.Sprintf("%s/%d", ex.RunID, ex.Step)
		if seen[key] || ex.Response.Message.Content != key || len(ex.Request.Tools) != 1 || len(ex.Request.Messages[0].Content) != 5000 {
			t.Fatalf("bad exchange %s: %+v", key, ex.Response)
		}
		seen[key] = true
	}
}

func TestRecorderSkipsFailures(t *testing.T) {
	var buf bytes.Buffer
	boom := errors.New("boom")
	rec := planner.NewRecorder(planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		return planner.Response{}, boom
	}), &buf, nil)
	if _, err := rec.Complete(context.Background(), planner.Request{RunID: "r"}); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if buf.Len() != 0 {
		t.Fatalf("a failed exchange was recorded: %s", buf.String())
	}
}

func TestRecordThenReplay(t *testing.T) {
	var buf bytes.Buffer
	rec := planner.NewRecorder(echoModel, &buf, nil)
	ctx := context.Background()
	for _, run := range []string{"A", "B"} {
		for step := range 2 {
			if _, err := rec.Complete(ctx, planner.Request{RunID: run, Step: step}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// B's step 0 was retried with a different answer.
	buf.WriteString(`{"run_id":"B","step":0,"request":{"messages":[]},"response":{"message":{"role":"assistant","content":"B/0 again"}}}` + "\n\n")

	rp, err := planner.NewReplay(&buf)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(run string, step int) (string, error) {
		resp, err := rp.Complete(ctx, planner.Request{RunID: run, Step: step})
		return resp.Message.Content, err
	}
	tests := []struct {
		run  string
		step int
		want string
	}{
		{"A", 1, "A/1"},       // a recorded run id answers itself
		{"X", 0, "A/0"},       // the first new run replays the first recorded run
		{"Y", 0, "B/0"},       // the second new run replays the second
		{"Z", 1, "A/1"},       // the third cycles back to the first
		{"X", 1, "A/1"},       // a run stays bound to its recording
		{"B", 0, "B/0"},       // several answers for a step are served in order
		{"B", 0, "B/0 again"}, //
		{"B", 0, "B/0 again"}, // the last one repeats
		{"A", 7, "no recorded answer for step 7"},
		{"X", 2, "no recorded answer for step 2"},
	}
	for _, tt := range tests {
		got, err := ask(tt.run, tt.step)
		if strings.HasPrefix(tt.want, "no recorded") {
			if !errors.Is(err, planner.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%s/%d: err = %v, want a permanent %q", tt.run, tt.step, err, tt.want)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Fatalf("%s/%d = %q, %v; want %q", tt.run, tt.step, got, err, tt.want)
		}
	}

	// The planner normalizes call ids in place: a served answer must not alias the cassette.
	r1, _ := rp.Complete(ctx, planner.Request{RunID: "A", Step: 0})
	r1.Message.ToolCalls[0].CallID = "mutated"
	r2, _ := rp.Complete(ctx, planner.Request{RunID: "A", Step: 0})
	if r2.Message.ToolCalls[0].CallID != "c" || r2.Usage.InputTokens != 1 || r2.Model != "echo" {
		t.Fatalf("replayed %+v", r2)
	}
}

func TestReplayErrors(t *testing.T) {
	rp, err := planner.NewReplay(strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rp.Complete(context.Background(), planner.Request{RunID: "r"}); !errors.Is(err, planner.ErrPermanent) {
		t.Fatalf("an empty cassette must fail the run: %v", err)
	}
	_, err = planner.NewReplay(strings.NewReader(`{"run_id":"a","step":0,"request":{},"response":{}}` + "\nnot json\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("err = %v, want the bad line named", err)
	}
	if _, err := planner.OpenReplay(filepath.Join(t.TempDir(), "missing.jsonl")); err == nil || !strings.HasPrefix(err.Error(), "planner: replay") {
		t.Fatalf("err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := rp.Complete(ctx, planner.Request{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

// TestIncidentCassette replays the demo cassette (recorded from the incident script,
// see planner/models/models_test.go) the way the planner asks for it.
func TestIncidentCassette(t *testing.T) {
	rp, err := planner.OpenReplay(filepath.Join("testdata", "incident.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	exs := readCassette(t, filepath.Join("testdata", "incident.jsonl"))
	if len(exs) != 3 {
		t.Fatalf("%d exchanges, want 3", len(exs))
	}
	var calls []string
	for step := range 3 {
		resp, err := rp.Complete(context.Background(), planner.Request{RunID: "any-run", Step: step})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.Message.ToolCalls {
			calls = append(calls, c.Tool+c.Arguments)
		}
		if step == 2 && !strings.HasPrefix(resp.Message.Content, "INC-404 does not exist. INC-001 is a high-severity incident") {
			t.Fatalf("answer %q", resp.Message.Content)
		}
		// The answers name what serves the run (the cassette), not the model recorded in it.
		if want := "replay:" + filepath.Join("testdata", "incident.jsonl"); resp.Model != want {
			t.Fatalf("step %d answered by model %q, want %q", step, resp.Model, want)
		}
	}
	want := `lookup_incident{"incident_id":"INC-404"},calculator{"expression":"17 * 38 + 55"},lookup_incident{"incident_id":"INC-001"}`
	if got := strings.Join(calls, ","); got != want {
		t.Fatalf("calls %s, want %s", got, want)
	}
}
