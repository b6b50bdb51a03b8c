package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/mcpserver"
)

// TestMCPToolLogs: a tool's log lines reach the host that called it as
// notifications/message at or above the level it set (logging/setLevel), redacted, with
// their attributes; an attempt that logs more than worker.MaxLogLines publishes that
// many, then one line that counts the rest.
func TestMCPToolLogs(t *testing.T) {
	const secret = "sk-test-0123456789abcdefghijklmnop"
	tools := []executor.Tool{
		{Name: "chatty", Description: "Logs at every level.", InputSchema: json.RawMessage(`{"type":"object"}`),
			Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
				log := executor.Logger(ctx)
				log.Debug("debug line")
				log.Info("info line")
				log.Warn("disk almost full, key "+secret, "free_mb", 12)
				log.Error("error line")
				return "done", nil
			}},
		{Name: "flood", Description: "Logs too much.", InputSchema: json.RawMessage(`{"type":"object"}`),
			Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
				for i := range worker.MaxLogLines + 5 {
					executor.Logger(ctx).Info("line " + strconv.Itoa(i))
				}
				return "done", nil
			}},
	}
	p := startPipeline(t, tools...)
	for _, version := range []string{"2025-11-25", mcpserver.Protocol2026} {
		t.Run(version, func(t *testing.T) {
			var (
				mu  sync.Mutex
				got []*mcp.LoggingMessageParams
			)
			cs := connectVersion(t, p, version, &mcp.ClientOptions{LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, req.Params)
			}})
			params := &mcp.CallToolParams{Name: "chatty", Arguments: map[string]any{}}
			if version == mcpserver.Protocol2026 {
				// 2026-07-28 sets the level per request (_meta), not per session.
				params.Meta = mcp.Meta{mcp.MetaKeyLogLevel: "warning"}
			} else if err := cs.SetLoggingLevel(p.ctx, &mcp.SetLoggingLevelParams{Level: "warning"}); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.CallTool(p.ctx, params); err != nil {
				t.Fatal(err)
			}
			eventstest.Eventually(t, 30*time.Second, func() error {
				mu.Lock()
				defer mu.Unlock()
				if len(got) < 2 {
					return fmt.Errorf("%d log notifications so far", len(got))
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 2 || got[0].Level != "warning" || got[1].Level != "error" || got[0].Logger != "chatty" {
				t.Fatalf("notifications %+v, want the warning and the error lines only", got)
			}
			warn, _ := json.Marshal(got[0].Data)
			if want := `{"attrs":{"free_mb":12},"message":"disk almost full, key [REDACTED]"}`; string(warn) != want {
				t.Errorf("warning data %s, want %s", warn, want)
			}
		})
	}

	cs := connectVersion(t, p, "2025-11-25", nil)
	res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "flood", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	run, _ := res.Meta[mcpserver.MetaRun].(string)
	evs, err := runlog.Events(p.ctx, p.bus, run)
	if err != nil {
		t.Fatal(err)
	}
	var lines []toolbus.ToolLog
	v := audit.Visitor{ToolLog: func(_ runlog.StoredEvent, tl toolbus.ToolLog) { lines = append(lines, tl) }}
	for _, e := range evs {
		v.Visit(e)
	}
	if len(lines) != worker.MaxLogLines+1 {
		t.Fatalf("%d tool.log events, want %d and one that counts the rest", len(lines), worker.MaxLogLines+1)
	}
	for i, l := range lines {
		if l.Seq != i+1 {
			t.Fatalf("line %d has seq %d: want them in order", i, l.Seq)
		}
	}
	if last := lines[len(lines)-1]; last.Dropped != 5 || last.Level != "warning" || lines[worker.MaxLogLines-1].Message != "line 99" {
		t.Errorf("last line %+v, want a warning counting 5 dropped after line 99", last)
	}
}

// connectVersion connects a go-sdk client speaking version to the MCP server of the
// pipeline's catalog over the in-memory transport.
func connectVersion(t *testing.T, p *pipeline, version string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	srv, err := mcpserver.New(p.ctx, p.bus, mcpserver.Config{Source: "/mcp-test", Principal: "tester", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(p.ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, opts).Connect(p.ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}
