package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/mcpserver"
	"github.com/toolbus/toolbus/planner"
)

// pipeline is the executor (demo and diag packs plus extra tools), a planner whose model
// must never be called (a pre-planned run calls none) and the injector, on an embedded
// server.
type pipeline struct {
	t   *testing.T
	ctx context.Context
	bus *events.Bus

	mu          sync.Mutex
	modelCalled int
}

func startPipeline(t *testing.T, extra ...executor.Tool) *pipeline {
	t.Helper()
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 3*time.Minute)
	bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := &pipeline{t: t, ctx: ctx, bus: bus}
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo", "diag"); err != nil {
		t.Fatal(err)
	}
	for _, tool := range extra {
		if err := reg.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	log := quiet()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	serve := func(w interface{ Run(context.Context) error }, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(wctx); err != nil && wctx.Err() == nil {
				t.Errorf("worker: %v", err)
			}
		}()
	}
	wc := func(instance string) events.WorkerConfig {
		return events.WorkerConfig{Instance: instance, Logger: log, Grace: time.Second}
	}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(log), executor.WithInstance("exec-1")))
	serve(worker.New(bus, exec, worker.Config{WorkerConfig: wc("exec-1")}))
	cat, err := bus.Store().WatchCatalog(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		if _, ok := cat.Lookup("noop"); !ok {
			return fmt.Errorf("catalog not published yet")
		}
		return nil
	})
	model := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		p.mu.Lock()
		p.modelCalled++
		p.mu.Unlock()
		return planner.Response{}, planner.Permanent(fmt.Errorf("no model in these tests"))
	})
	serve(planner.New(bus, model, cat, planner.Config{WorkerConfig: wc("planner-1")}))
	serve(injector.New(bus, injector.Config{WorkerConfig: wc("injector-1")}))
	return p
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (p *pipeline) waitStatus(run string, want toolbus.RunStatus) {
	p.t.Helper()
	eventstest.Eventually(p.t, 30*time.Second, func() error {
		st, _, err := p.bus.Store().RunState(p.ctx, run)
		if err != nil {
			return err
		}
		if st.Status != want {
			return fmt.Errorf("run %s is %s, want %s", run, st.Status, want)
		}
		return nil
	})
}

// waitEvent waits until the run has an event of type typ.
func (p *pipeline) waitEvent(run, typ string) {
	p.t.Helper()
	eventstest.Eventually(p.t, 30*time.Second, func() error {
		evs, err := p.bus.RunEvents(p.ctx, run)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Meta.Type == typ {
				return nil
			}
		}
		return fmt.Errorf("run %s has no %s yet", run, typ)
	})
}

// mcpClient connects a go-sdk client over the in-memory transport to the MCP server of
// the pipeline's catalog.
func mcpClient(t *testing.T, p *pipeline, opts *mcp.ClientOptions) *mcp.ClientSession {
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
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, opts).Connect(p.ctx, ct, nil)
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
	p := startPipeline(t)
	cs := mcpClient(t, p, nil)
	res, err := cs.ListTools(p.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		got[tool.Name] = tool
	}
	cat, err := p.bus.Store().WatchCatalog(p.ctx, nil)
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
	p := startPipeline(t)
	cs := mcpClient(t, p, nil)
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
			run, _ := res.Meta[mcpserver.MetaRun].(string)
			if run == "" {
				t.Fatalf("result _meta %v names no run", res.Meta)
			}
			// The audit record: the call and its result are in the stream, and the run
			// ended completed without any model call.
			p.waitEvent(run, events.TypeToolRequested)
			p.waitEvent(run, events.TypeToolFinished)
			p.waitStatus(run, toolbus.RunCompleted)
			p.mu.Lock()
			calls := p.modelCalled
			p.mu.Unlock()
			if calls != 0 {
				t.Fatalf("the model was called %d time(s) for a pre-planned run", calls)
			}
		})
	}
}

// TestMCPHTTPSessions: sessions beyond the cap are refused (503) and idle ones close.
func TestMCPHTTPSessions(t *testing.T) {
	p := startPipeline(t)
	tok := door.NewToken()
	access, err := door.NewSource(door.Entry("carol", tok, nil), "")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mcpserver.New(p.ctx, p.bus, mcpserver.Config{Source: "/mcp-test", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(mcpserver.HTTPHandler(srv, mcpserver.HTTPConfig{
		Listen: "127.0.0.1:0", Access: access, SessionTimeout: time.Second, MaxSessions: 3, Logger: quiet(),
	}))
	defer hs.Close()
	initialize := func() int {
		resp := mcpPost(t, hs.URL, tok, "", mcpInitialize, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 3 {
		if code := initialize(); code != http.StatusOK {
			t.Fatalf("session %d: status %d", i+1, code)
		}
	}
	if code := initialize(); code != http.StatusServiceUnavailable {
		t.Fatalf("a session beyond the cap: status %d, want 503", code)
	}
	// Idle sessions close after the timeout, and the cap has room again.
	eventstest.Eventually(t, 30*time.Second, func() error {
		n := 0
		for range srv.Sessions() {
			n++
		}
		if n > 0 {
			return fmt.Errorf("%d sessions still live", n)
		}
		return nil
	})
	if code := initialize(); code != http.StatusOK {
		t.Fatalf("after the idle sessions closed: status %d", code)
	}
}

const mcpInitialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`

// mcpPost posts one JSON-RPC message to a streamable HTTP endpoint.
func mcpPost(t *testing.T, endpoint, token, session, body string, edit func(*http.Request)) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	if edit != nil {
		edit(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return &http.Response{StatusCode: 0, Body: io.NopCloser(strings.NewReader("")), Header: http.Header{}}
	}
	return resp
}

// crawlTool is a long-running tool (heartbeat timeout hb) that reports increasing
// progress every hb/20 for 2.5 heartbeat timeouts, then answers.
func crawlTool(hb time.Duration) executor.Tool {
	return executor.Tool{Name: "crawl", Description: "crawls for a while, reporting progress", ReadOnly: true,
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 10 * time.Minute, HeartbeatTimeout: hb,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			start, n := time.Now(), 0
			for time.Since(start) < 5*hb/2 {
				n++
				if err := executor.Progress(ctx, float64(n), 1000, fmt.Sprintf("page %d", n)); err != nil {
					return nil, err
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(hb / 20):
				}
			}
			return map[string]int{"pages": n}, nil
		}}
}

// TestMCPProgress: a host that sends a progressToken gets the call's progress as
// notifications/progress (increasing, with the tool's message) before the result; a
// long-running tool that keeps reporting outlives its heartbeat timeout.
func TestMCPProgress(t *testing.T) {
	p := startPipeline(t, crawlTool(time.Second))
	var (
		mu  sync.Mutex
		got []*mcp.ProgressNotificationParams
	)
	cs := mcpClient(t, p, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		got = append(got, req.Params)
		mu.Unlock()
	}})
	waitOffered(t, p, cs, "crawl")
	params := &mcp.CallToolParams{Name: "crawl", Arguments: map[string]any{}}
	params.SetProgressToken("crawl-1")
	res, err := cs.CallTool(p.ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || !strings.Contains(resultText(res), "pages") {
		t.Fatalf("crawl: isError %v, %q", res.IsError, resultText(res))
	}
	// Notifications and the result travel on one connection in order; the handler runs
	// as each arrives.
	eventstest.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 {
			return fmt.Errorf("no progress notification")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	last := -1.0
	for _, n := range got {
		if n.ProgressToken != "crawl-1" || n.Total != 1000 || !strings.HasPrefix(n.Message, "page ") || n.Progress <= last {
			t.Fatalf("progress notification %+v (after %v): want token crawl-1, total 1000, a page message, increasing", n, last)
		}
		last = n.Progress
	}
}

// TestMCPNoProgressWithoutToken: without a progressToken the host gets no progress
// notifications, only the result.
func TestMCPNoProgressWithoutToken(t *testing.T) {
	p := startPipeline(t, crawlTool(time.Second))
	var (
		mu sync.Mutex
		n  int
	)
	cs := mcpClient(t, p, &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		n++
		mu.Unlock()
	}})
	waitOffered(t, p, cs, "crawl")
	res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "crawl", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("crawl: %v %+v", err, res)
	}
	// A notification sent would have arrived before the result on the same connection;
	// a list round trip after the result flushes anything still in flight.
	if _, err := cs.ListTools(p.ctx, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n != 0 {
		t.Fatalf("%d progress notifications without a progressToken", n)
	}
}

// waitOffered waits until tools/list offers tool.
func waitOffered(t *testing.T, p *pipeline, cs *mcp.ClientSession, tool string) {
	t.Helper()
	eventstest.Eventually(t, 30*time.Second, func() error {
		list, err := cs.ListTools(p.ctx, nil)
		if err != nil {
			return err
		}
		for _, tl := range list.Tools {
			if tl.Name == tool {
				return nil
			}
		}
		return fmt.Errorf("%s not offered yet", tool)
	})
}
