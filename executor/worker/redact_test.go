package worker_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
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

// TestSecretsNeverStored: what a tool prints of the executor's own secret (its NATS
// password) reaches the stream redacted in every event of the call: the tool.progress
// it reports, the failed attempt its retry policy records and the final result, in
// clear and base64-encoded.
func TestSecretsNeverStored(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{Memory: true})
	ctx := eventstest.Context(t, 2*time.Minute)
	password := "n4ts-" + strings.Repeat("Pw", 8)
	basic := base64.StdEncoding.EncodeToString([]byte("toolbus:" + password))
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "login", Description: "logs in", InputSchema: json.RawMessage(`{"type":"object"}`),
		Retry: &toolbus.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond},
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			if err := executor.Progress(ctx, 1, 2, "connecting with password "+password); err != nil {
				return nil, err
			}
			if ci, _ := executor.CallInfoFrom(ctx); ci.Attempt == 1 {
				return nil, executor.NewRetryableError("login_failed", "Authorization: Basic "+basic+" refused")
			}
			return "logged in with " + basic, nil
		}}); err != nil {
		t.Fatal(err)
	}
	ex := testutil.Must(executor.New(reg, executor.WithSecrets(password)))
	w, err := worker.New(bus, ex, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "redact"}, ProgressInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	serveWorker(t, ctx, bus, w, "login")
	const run = "redact-1"
	startRun(t, ctx, bus, run)
	if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("test", toolbus.ToolRequested{
		RunID: run, Step: 0, CallIndex: 0, CallCount: 1, Call: toolbus.ToolCall{CallID: "c0", Tool: "login", Arguments: `{}`}}, true)); err != nil {
		t.Fatal(err)
	}
	evs := eventsWithResult(t, ctx, bus, run, 60*time.Second)
	progress := 0
	for _, e := range evs {
		if strings.Contains(string(e.Data), password) || strings.Contains(string(e.Data), basic) {
			t.Errorf("%s holds the secret: %s", e.Meta.Type, e.Data)
		}
		switch e.Meta.Type {
		case events.TypeToolProgress:
			progress++
			if !strings.Contains(string(e.Data), "connecting with password "+executor.Redacted) {
				t.Errorf("tool.progress %s: want the password redacted", e.Data)
			}
		case events.TypeToolFinished:
			var f toolbus.ToolFinished
			if err := json.Unmarshal(e.Data, &f); err != nil {
				t.Fatal(err)
			}
			if f.Status != toolbus.StatusSucceeded || len(f.Retries) != 1 || !strings.Contains(f.Retries[0].Error.Message, executor.Redacted) {
				t.Errorf("tool.finished %s: want success after one recorded attempt whose error is redacted", e.Data)
			}
		}
	}
	if progress == 0 {
		t.Fatal("no tool.progress stored")
	}
}
