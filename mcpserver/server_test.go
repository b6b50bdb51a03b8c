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
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/mcpserver"
	"github.com/toolbus/toolbus/mcpserver/mcptest"
	"github.com/toolbus/toolbus/planner"
)

// pipeline is the executor (demo and diag packs plus extra tools), a planner whose model
// must never be called (a pre-planned run calls none) and the injector, on an embedded
// server (testpipe).
type pipeline struct {
	*testpipe.Pipeline
	t   *testing.T
	ctx context.Context
	bus *events.Bus

	mu          sync.Mutex
	modelCalled int
}

func startPipeline(t *testing.T, extra ...executor.Tool) *pipeline {
	t.Helper()
	p := &pipeline{t: t}
	model := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		p.mu.Lock()
		p.modelCalled++
		p.mu.Unlock()
		return planner.Response{}, planner.Permanent(fmt.Errorf("no model in these tests"))
	})
	tp := testpipe.Start(t, 3*time.Minute, model, extra...)
	p.Pipeline, p.ctx, p.bus = tp, tp.Ctx, tp.Bus
	return p
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

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
			p.WaitEvent(run, events.TypeToolRequested)
			p.WaitEvent(run, events.TypeToolFinished)
			p.WaitStatus(run, toolbus.RunCompleted)
			p.mu.Lock()
			calls := p.modelCalled
			p.mu.Unlock()
			if calls != 0 {
				t.Fatalf("the model was called %d time(s) for a pre-planned run", calls)
			}
		})
	}
}

// httpDoor serves srv behind the HTTP door with an access list of entries.
func httpDoor(t *testing.T, srv *mcp.Server, cfg mcpserver.HTTPConfig, entries ...string) *httptest.Server {
	t.Helper()
	access, err := door.NewSource(strings.Join(entries, ";"), "")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Access, cfg.Logger = "127.0.0.1:0", access, quiet()
	hs := httptest.NewServer(mcpserver.HTTPHandler(srv, cfg))
	t.Cleanup(hs.Close)
	return hs
}

// postStatus posts body (in session when set) with tok and returns the status and the
// session id of the answer.
func postStatus(t *testing.T, hs *httptest.Server, tok, session, body string) (int, string) {
	t.Helper()
	resp := mcptest.Post(t, hs.URL, tok, session, body, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id")
}

const ping = `{"jsonrpc":"2.0","id":2,"method":"ping"}`

// TestMCPHTTPSessions: a new session of a token that holds none is refused (503) once
// the sessions of other tokens fill the cap, and idle sessions close.
func TestMCPHTTPSessions(t *testing.T) {
	p := startPipeline(t)
	srv, err := mcpserver.New(p.ctx, p.bus, mcpserver.Config{Source: "/mcp-test", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	carol, dave := door.NewToken(), door.NewToken()
	hs := httpDoor(t, srv, mcpserver.HTTPConfig{SessionTimeout: time.Second, MaxSessions: 3},
		door.Entry("carol", carol, nil), door.Entry("dave", dave, nil))
	for i := range 3 {
		if code, _ := postStatus(t, hs, carol, "", mcptest.Initialize); code != http.StatusOK {
			t.Fatalf("session %d: status %d", i+1, code)
		}
	}
	if code, _ := postStatus(t, hs, dave, "", mcptest.Initialize); code != http.StatusServiceUnavailable {
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
	if code, _ := postStatus(t, hs, dave, "", mcptest.Initialize); code != http.StatusOK {
		t.Fatalf("after the idle sessions closed: status %d", code)
	}
}

// TestMCPHTTPSessionOwner: a session belongs to the token that opened it, not to the
// token's name: another token of the same name (another device of a service, or the
// new token of a rotation) gets 403 on it.
func TestMCPHTTPSessionOwner(t *testing.T) {
	p := startPipeline(t)
	srv, err := mcpserver.New(p.ctx, p.bus, mcpserver.Config{Source: "/mcp-test", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	laptop, phone := door.NewToken(), door.NewToken()
	hs := httpDoor(t, srv, mcpserver.HTTPConfig{}, door.Entry("svc", laptop, nil), door.Entry("svc", phone, nil))
	code, session := postStatus(t, hs, laptop, "", mcptest.Initialize)
	if code != http.StatusOK || session == "" {
		t.Fatalf("initialize: %d, session %q", code, session)
	}
	if code, _ := postStatus(t, hs, phone, session, ping); code != http.StatusForbidden {
		t.Fatalf("the session used with another token of the same name: %d, want 403", code)
	}
	if code, _ := postStatus(t, hs, laptop, session, ping); code != http.StatusOK {
		t.Fatalf("the session used with its own token: %d, want 200", code)
	}
}

// TestMCPHTTPSessionCapPerToken: one token cannot take every session. A token at its
// own cap, or at the total cap while it holds sessions, gives up its oldest session for
// the new one; another token still gets a session, and only a token holding none is
// refused when the others fill the total.
func TestMCPHTTPSessionCapPerToken(t *testing.T) {
	p := startPipeline(t)
	srv, err := mcpserver.New(p.ctx, p.bus, mcpserver.Config{Source: "/mcp-test", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	greedy, dave, erin := door.NewToken(), door.NewToken(), door.NewToken()
	hs := httpDoor(t, srv, mcpserver.HTTPConfig{MaxSessions: 3, MaxSessionsPerToken: 2},
		door.Entry("greedy", greedy, nil), door.Entry("dave", dave, nil), door.Entry("erin", erin, nil))
	var mine []string
	for i := range 5 {
		code, s := postStatus(t, hs, greedy, "", mcptest.Initialize)
		if code != http.StatusOK || s == "" {
			t.Fatalf("greedy's session %d: %d, want 200 (its oldest given up)", i+1, code)
		}
		mine = append(mine, s)
	}
	// The three oldest were given up (404: the client opens a new one); the two newest live.
	eventstest.Eventually(t, 10*time.Second, func() error {
		for i, s := range mine {
			code, _ := postStatus(t, hs, greedy, s, ping)
			if want := map[bool]int{true: http.StatusNotFound, false: http.StatusOK}[i < 3]; code != want {
				return fmt.Errorf("greedy's session %d: %d, want %d", i+1, code, want)
			}
		}
		return nil
	})
	code, d1 := postStatus(t, hs, dave, "", mcptest.Initialize)
	if code != http.StatusOK {
		t.Fatalf("dave beside greedy's sessions: %d, want 200", code)
	}
	if code, _ := postStatus(t, hs, erin, "", mcptest.Initialize); code != http.StatusServiceUnavailable {
		t.Fatalf("erin with the total cap full and no session of hers: %d, want 503", code)
	}
	if code, _ := postStatus(t, hs, dave, "", mcptest.Initialize); code != http.StatusOK {
		t.Fatalf("dave's second session at the total cap: %d, want 200 (his oldest given up)", code)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		if code, _ := postStatus(t, hs, dave, d1, ping); code != http.StatusNotFound {
			return fmt.Errorf("dave's first session: %d, want 404 (given up)", code)
		}
		return nil
	})
	if code, _ := postStatus(t, hs, greedy, mine[4], ping); code != http.StatusOK {
		t.Fatalf("greedy's newest session after dave's: %d, want 200", code)
	}
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
