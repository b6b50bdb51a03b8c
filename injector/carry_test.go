package injector

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// The model.requested that settle publishes carries the joined results of the step
// before when they fit the history store's inline budget: exactly the results the store
// holds for the step (so the planner builds the same tool messages from either), and
// none when they do not fit.
func TestSettleCarriesTheStepsResults(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	// A rejected result that does not end the run (unknown_tool would: DefaultFailOn).
	excess := toolbus.ToolError{Code: toolbus.CodeTooManyCalls, Message: "not run: too many calls", Retryable: true}
	failed := toolbus.ToolError{Code: "not_found", Message: "no such thing"}
	for _, tc := range []struct {
		name    string
		results []toolbus.ToolResult // by call index; call i is c<i> of tool t
		carried bool
	}{
		{"error, large and rejected", []toolbus.ToolResult{
			{Status: toolbus.StatusFailed, Error: &failed, Content: `{"error":{"code":"not_found"}}`, Attempt: 1, Executor: "exec-1"},
			{Status: toolbus.StatusSucceeded, Output: json.RawMessage(`{"lines":["a","b"]}`),
				Content:   strings.Repeat("line of output\n", store.InlineResultMax/10),
				Truncated: &toolbus.Truncation{OriginalBytes: 5 << 20, KeptBytes: 16384, Ref: "kv://toolbus_outputs/t.x.0.c1"},
				Attempt:   2, Executor: "exec-2"},
			{Status: toolbus.StatusRejected, Error: &excess, Content: "not run: too many calls", Executor: "/toolbus/planner/p"},
		}, true},
		{"over the budget", []toolbus.ToolResult{
			{Status: toolbus.StatusSucceeded, Content: strings.Repeat("x", bus.Store().InlineBudget()/2)},
			{Status: toolbus.StatusSucceeded, Content: strings.Repeat("y", bus.Store().InlineBudget()/2)},
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := "carry-" + strings.ReplaceAll(tc.name, " ", "-")
			run = strings.ReplaceAll(run, ",", "")
			if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: "tester"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := bus.Store().CreateRunState(ctx, run, time.Now()); err != nil {
				t.Fatal(err)
			}
			n := len(tc.results)
			recordCalls(t, ctx, bus, run, 0, n)
			for i, r := range tc.results {
				r.CallID, r.Tool = "c"+strconv.Itoa(i), "t"
				if err := in.Finished(ctx, toolbus.ToolFinished{RunID: run, Step: 0, CallIndex: i, CallCount: n, ToolResult: r}); err != nil {
					t.Fatalf("result %d: %v", i, err)
				}
			}
			raw, err := bus.EventStream().GetLastMsgForSubject(ctx, events.SubjectModelRequested(run))
			if err != nil {
				t.Fatalf("no model.requested for step 1: %v", err)
			}
			var mr toolbus.ModelRequested
			if _, err := events.Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, &mr); err != nil {
				t.Fatal(err)
			}
			if mr.Step != 1 {
				t.Fatalf("model.requested for step %d, want 1", mr.Step)
			}
			if !tc.carried {
				if len(mr.PrevResults) != 0 {
					t.Fatalf("%d results carried over the budget", len(mr.PrevResults))
				}
				return
			}
			rec, _, err := bus.Store().Step(ctx, run, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(mr.PrevResults) != n {
				t.Fatalf("%d results carried, want %d", len(mr.PrevResults), n)
			}
			// The results the store holds, Output dropped as in the join state.
			for i, r := range rec.Results {
				if got, want := mustJSON(t, mr.PrevResults[i]), mustJSON(t, *r); !bytes.Equal(got, want) {
					t.Errorf("result %d carried:\n%s\nstored:\n%s", i, got, want)
				}
				if mr.PrevResults[i].Output != nil {
					t.Errorf("result %d carries its output", i)
				}
			}
			// The tool messages the model reads, built from either.
			mine := make([]toolbus.Message, n)
			for i, r := range mr.PrevResults {
				mine[i] = toolbus.ToolMessage(r)
			}
			if got, want := mustJSON(t, mine), mustJSON(t, rec.ToolMessages()); !bytes.Equal(got, want) {
				t.Errorf("tool messages from the carried results:\n%s\nfrom the store:\n%s", got, want)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
