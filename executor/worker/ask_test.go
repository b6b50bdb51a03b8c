package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestAskDurable: a question is one per step, call and seq, whichever attempt asks it.
// A tool that asks a question its run's principal answered before (an earlier attempt
// asked it) gets that answer at once and nothing is published; one already asked and
// unanswered is not asked again, the tool waits for its answer; an answer by anyone
// else counts for nothing, before or after the ask. Each run ends with exactly one
// tool.question and the principal's answer in the tool's result.
func TestAskDurable(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{Memory: true})
	ctx := eventstest.Context(t, 2*time.Minute)
	schema := json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "asks", Description: "asks how many", InputSchema: json.RawMessage(`{"type":"object"}`),
		Timeout: time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			a, err := executor.Ask(ctx, "how many?", schema)
			if err != nil {
				return nil, err
			}
			return map[string]any{"action": a.Action, "answer": a.Content, "by": a.Who}, nil
		}}); err != nil {
		t.Fatal(err)
	}
	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	w, err := worker.New(bus, testutil.Must(executor.New(reg)), worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "ask", Logger: log}})
	if err != nil {
		t.Fatal(err)
	}
	serveWorker(t, ctx, bus, w, "asks")

	question := func(run string, attempt int) toolbus.ToolQuestion {
		return toolbus.ToolQuestion{RunID: run, CallID: "c0", Tool: "asks", Attempt: attempt, Seq: 1, Message: "how many?", Schema: schema}
	}
	answer := func(run, who string, n int) toolbus.ToolAnswer {
		return toolbus.ToolAnswer{RunID: run, CallID: "c0", Tool: "asks", Attempt: 1, Seq: 1, Action: "accept",
			Content: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)), Who: who}
	}
	publish := func(e events.Envelope) {
		t.Helper()
		if _, err := bus.PublishEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, run string
		// before: answers stored before the call runs (after its question, when asked).
		asked  bool
		before []toolbus.ToolAnswer
		// waits: the log line that says the call waits; then after is published.
		waits string
		after []toolbus.ToolAnswer
		want  string
	}{
		{name: "answered before the ask: returned without a new question", run: "durable-1", asked: true,
			before: []toolbus.ToolAnswer{answer("durable-1", "p", 3)}, want: `"n":3`},
		{name: "asked before, unanswered: not asked again", run: "durable-2", asked: true,
			waits: "waiting for its answer, not asked again", after: []toolbus.ToolAnswer{answer("durable-2", "p", 4)}, want: `"n":4`},
		{name: "answered before by someone else: it waits for the principal", run: "durable-3", asked: true,
			before: []toolbus.ToolAnswer{answer("durable-3", "mallory", 9)},
			waits:  "waiting for its answer, not asked again", after: []toolbus.ToolAnswer{answer("durable-3", "p", 5)}, want: `"n":5`},
		{name: "a new question", run: "durable-4", waits: "call asks its caller",
			after: []toolbus.ToolAnswer{answer("durable-4", "mallory", 9), answer("durable-4", "p", 6)}, want: `"n":6`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := tc.run
			startRun(t, ctx, bus, run)
			if tc.asked { // by an attempt that died
				publish(events.ToolQuestionEvent("test", question(run, 1)))
			}
			for _, a := range tc.before {
				publish(events.ToolAnswerEvent("test", a))
			}
			publish(events.ToolRequestedEvent("test", toolbus.ToolRequested{RunID: run, CallIndex: 0, CallCount: 1,
				Principal: toolbus.Principal{ID: "p"}, Call: toolbus.ToolCall{CallID: "c0", Tool: "asks", Arguments: `{}`}}, true))
			if tc.waits != "" {
				eventstest.Eventually(t, 30*time.Second, func() error {
					for _, l := range strings.Split(logs.String(), "\n") {
						if strings.Contains(l, tc.waits) && strings.Contains(l, "run_id="+run) {
							return nil
						}
					}
					return fmt.Errorf("the call does not wait yet (%q)", tc.waits)
				})
				for _, a := range tc.after {
					publish(events.ToolAnswerEvent("test", a))
				}
			}
			evs := eventsWithResult(t, ctx, bus, run, 30*time.Second)
			questions := 0
			for _, e := range evs {
				switch e.Meta.Type {
				case events.TypeToolQuestion:
					questions++
				case events.TypeToolFinished:
					var f toolbus.ToolFinished
					if err := e.Decode(&f); err != nil {
						t.Fatal(err)
					}
					if f.Status != toolbus.StatusSucceeded || !strings.Contains(f.Content, tc.want) || !strings.Contains(f.Content, `"by":"p"`) {
						t.Fatalf("result %s %s, want the principal's answer %s", f.Status, f.Content, tc.want)
					}
				}
			}
			if questions != 1 {
				t.Fatalf("%d tool.question events, want 1", questions)
			}
		})
	}
}
