package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestToolLogger: what a tool logs with executor.Logger reaches the call's log sink
// with MCP levels, its attributes as a JSON object (groups nested), redacted as results
// are (secrets, the tool's RedactFields keys); a record after the call returned, or
// under a context that is no call's, is dropped.
func TestToolLogger(t *testing.T) {
	const secret = "s3cr3t-value-of-the-test"
	var (
		mu    sync.Mutex
		recs  []executor.LogRecord
		late  *slog.Logger
		lateC = make(chan struct{})
	)
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "chatty", Description: "Logs.", InputSchema: json.RawMessage(`{"type":"object"}`),
		RedactFields: []string{"password"},
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			log := executor.Logger(ctx)
			log.Debug("checking")
			log.Info("connecting with "+secret, "host", "db1", "password", "hunter2")
			log.With("shard", 3).WithGroup("req").Warn("slow", "ms", 2300, "err", errors.New("timeout"))
			log.Error("gave up")
			late = log
			return "ok", nil
		}}); err != nil {
		t.Fatal(err)
	}
	ex := testutil.Must(executor.New(reg, executor.WithSecrets(secret)))
	ctx := executor.WithLogSink(context.Background(), func(r executor.LogRecord) {
		mu.Lock()
		defer mu.Unlock()
		recs = append(recs, r)
	})
	res := ex.Execute(ctx, toolbus.ToolCall{CallID: "c1", Tool: "chatty", Arguments: "{}"}, toolbus.Principal{ID: "p"})
	if res.Status != toolbus.StatusSucceeded {
		t.Fatalf("result %+v", res)
	}
	late.Info("after the call") // dropped: the call returned
	executor.Logger(context.Background()).Info("no call")
	close(lateC)
	mu.Lock()
	defer mu.Unlock()
	want := []struct{ level, msg, attrs string }{
		{"debug", "checking", ""},
		{"info", "connecting with [REDACTED]", `{"host":"db1","password":"[REDACTED]"}`},
		{"warning", "slow", `{"req":{"err":"timeout","ms":2300},"shard":3}`},
		{"error", "gave up", ""},
	}
	if len(recs) != len(want) {
		t.Fatalf("got %d records %+v, want %d", len(recs), recs, len(want))
	}
	for i, w := range want {
		if r := recs[i]; r.Level != w.level || r.Message != w.msg || string(r.Attrs) != w.attrs || r.At.IsZero() {
			t.Errorf("record %d is %s %q %s, want %s %q %s", i, r.Level, r.Message, r.Attrs, w.level, w.msg, w.attrs)
		}
	}
}

// TestMCPLevel: slog levels map to the nearest MCP level.
func TestMCPLevel(t *testing.T) {
	for l, want := range map[slog.Level]string{slog.LevelDebug - 4: "debug", slog.LevelDebug: "debug", slog.LevelInfo: "info",
		slog.LevelInfo + 2: "info", slog.LevelWarn: "warning", slog.LevelError: "error", slog.LevelError + 4: "error"} {
		if got := executor.MCPLevel(l); got != want {
			t.Errorf("MCPLevel(%v) = %s, want %s", l, got, want)
		}
	}
}
