package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/events"
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
			p.waitStatus(run, events.RunCompleted)
			p.mu.Lock()
			calls := len(p.reqs[run])
			p.mu.Unlock()
			if calls != 0 {
				t.Fatalf("the model was called %d time(s) for a pre-planned run", calls)
			}
		})
	}
}
