package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
)

// mcpClient connects a go-sdk client over the in-memory transport to the MCP server of
// the pipeline's catalog.
func mcpClient(t *testing.T, p *opsPipeline) *mcp.ClientSession {
	t.Helper()
	srv, err := newMCPServer(p.ctx, p.bus, mcpConfig{
		Source: "/mcp-test", Principal: "tester", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(p.ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, nil).Connect(p.ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text + "\n")
		}
	}
	return b.String()
}

// TestMCPListTools: tools/list offers the catalog's live tools with their input schemas.
func TestMCPListTools(t *testing.T) {
	p := startOpsPipeline(t, nil)
	cs := mcpClient(t, p)
	res, err := cs.ListTools(p.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		got[tool.Name] = tool
	}
	cat, err := p.bus.WatchCatalog(p.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := cat.Tools(nil)
	if len(want) == 0 || len(got) != len(want) {
		t.Fatalf("tools/list has %d tools, the catalog %d", len(got), len(want))
	}
	for _, tc := range want {
		if got[tc.Name] == nil {
			t.Errorf("tools/list lacks %s", tc.Name)
		}
	}
	schema, _ := json.Marshal(got["calculator"].InputSchema)
	if !strings.Contains(string(schema), `"expression"`) {
		t.Errorf("calculator input schema %s lacks its expression property", schema)
	}
}

// TestMCPCallTool: each tools/call is a pre-planned run on the bus; its result maps to
// MCP, and the model is never called.
func TestMCPCallTool(t *testing.T) {
	p := startOpsPipeline(t, nil)
	cs := mcpClient(t, p)
	tests := []struct {
		name     string
		tool     string
		args     map[string]any
		isError  bool
		text     string // in the result's text
		value    any    // structuredContent.value, when set
		approval bool   // answered at once: the call waits for approval
	}{
		{name: "succeeded", tool: "calculator", args: map[string]any{"expression": "2+3*4"}, text: "14", value: 14.0},
		{name: "tool error", tool: "calculator", args: map[string]any{"expression": "1/0"}, isError: true, text: "division_by_zero"},
		{name: "invalid arguments", tool: "calculator", args: map[string]any{"nope": 1}, isError: true, text: "invalid_arguments"},
		{name: "needs approval", tool: "restart_service", args: map[string]any{"service": "auth-api"}, isError: true, text: "toolbus approve mcp-", approval: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: tt.tool, Arguments: tt.args})
			if err != nil {
				t.Fatal(err)
			}
			text := resultText(res)
			if res.IsError != tt.isError {
				t.Fatalf("isError = %v, want %v (%s)", res.IsError, tt.isError, text)
			}
			if !strings.Contains(text, tt.text) {
				t.Fatalf("result text %q lacks %q", text, tt.text)
			}
			if tt.value != nil {
				sc, _ := json.Marshal(res.StructuredContent)
				var out map[string]any
				if err := json.Unmarshal(sc, &out); err != nil || out["value"] != tt.value {
					t.Fatalf("structuredContent = %s, want value %v", sc, tt.value)
				}
			}
			if tt.approval {
				return // the run waits for approval; nothing more to read here
			}
			run, _ := res.Meta[mcpMetaRun].(string)
			if run == "" {
				t.Fatalf("result _meta %v names no run", res.Meta)
			}
			// The audit record: the call and its result are in the stream, and the run
			// ended completed without any model call.
			p.waitEvent(run, events.TypeToolRequested)
			p.waitEvent(run, events.TypeToolFinished)
			p.waitStatus(run, toolbus.RunCompleted)
			p.mu.Lock()
			calls := len(p.reqs[run])
			p.mu.Unlock()
			if calls != 0 {
				t.Fatalf("the model was called %d time(s) for a pre-planned run", calls)
			}
		})
	}
}

// callCalculator lists the tools and calls calculator through cs.
func callCalculator(t *testing.T, ctx context.Context, cs *mcp.ClientSession) {
	t.Helper()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tool := range list.Tools {
		found = found || tool.Name == "calculator"
	}
	if !found {
		t.Fatalf("tools/list lacks calculator: %d tools", len(list.Tools))
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "calculator", Arguments: map[string]any{"expression": "6*7"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || !strings.Contains(resultText(res), "42") {
		t.Fatalf("calculator(6*7) = isError %v, %q", res.IsError, resultText(res))
	}
}

// TestMCPStdioBinary drives the built binary's `toolbus mcp` over stdio, as a host does:
// stdout carries only MCP messages.
func TestMCPStdioBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	p := startOpsPipeline(t, nil)
	bin := filepath.Join(t.TempDir(), "toolbus")
	if out, err := exec.CommandContext(p.ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(p.ctx, bin, "mcp")
	cmd.Env = append(os.Environ(), "TOOLBUS_NATS_URL="+p.srv.URL, "TOOLBUS_LOG_LEVEL=info")
	cmd.Stderr = io.Discard
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, nil).Connect(p.ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	callCalculator(t, p.ctx, cs)
}

// TestMCPHTTP drives `toolbus mcp --http` over streamable HTTP.
func TestMCPHTTP(t *testing.T) {
	p := startOpsPipeline(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(p.ctx)
	done := make(chan int, 1)
	go func() {
		code, _, _ := p.toolbusCtx(ctx, "mcp", "--http", addr)
		done <- code
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("toolbus mcp --http exited %d", code)
		}
	}()
	var cs *mcp.ClientSession
	eventstest.Eventually(t, 30*time.Second, func() error {
		var err error
		cs, err = mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, nil).
			Connect(p.ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/", MaxRetries: -1}, nil)
		return err
	})
	defer cs.Close()
	callCalculator(t, p.ctx, cs)
}
