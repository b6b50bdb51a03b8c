package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/mcpserver"
)

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text + "\n")
		}
	}
	return b.String()
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

// TestMCPHTTP drives `toolbus mcp --http` over streamable HTTP: only a bearer token of
// the access list gets in, each caller's runs carry its token's principal, foreign
// Origin and Host headers are refused, and a cancelled request gets no answer.
func TestMCPHTTP(t *testing.T) {
	p := startOpsPipeline(t, nil)
	alice, bob := door.NewToken(), door.NewToken()
	tokens := filepath.Join(t.TempDir(), "mcp-tokens")
	if err := os.WriteFile(tokens, []byte("# MCP callers\n"+door.Entry("alice", alice, []string{"ops"})+"\n"+door.Entry("bob", bob, nil)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOOLBUS_MCP_TOKENS_FILE", tokens)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	// ":PORT" listens on loopback only.
	addr := "127.0.0.1:" + port
	ctx, cancel := context.WithCancel(p.ctx)
	done := make(chan int, 1)
	go func() {
		code, _, _ := p.toolbusCtx(ctx, "mcp", "--http", ":"+port)
		done <- code
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("toolbus mcp --http exited %d", code)
		}
	}()
	endpoint := "http://" + addr + "/"
	eventstest.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get(endpoint)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})

	t.Run("refused", func(t *testing.T) {
		tests := []struct {
			name, token, origin, host string
			want                      int
		}{
			{name: "no token", want: http.StatusUnauthorized},
			{name: "wrong token", token: door.NewToken(), want: http.StatusUnauthorized},
			{name: "token's hash as token", token: strings.Fields(door.Entry("alice", alice, nil))[1], want: http.StatusUnauthorized},
			{name: "foreign origin", token: alice, origin: "https://evil.example", want: http.StatusForbidden},
			{name: "null origin", token: alice, origin: "null", want: http.StatusForbidden},
			{name: "foreign host (DNS rebinding)", token: alice, host: "evil.example:" + port, want: http.StatusForbidden},
			{name: "valid", token: alice, origin: "http://" + addr, want: http.StatusOK},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp := mcpPost(t, endpoint, tt.token, "", mcpInitialize, func(r *http.Request) {
					if tt.origin != "" {
						r.Header.Set("Origin", tt.origin)
					}
					if tt.host != "" {
						r.Host = tt.host
					}
				})
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tt.want {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, body)
				}
			})
		}
	})

	t.Run("principal per token", func(t *testing.T) {
		for _, c := range []struct {
			token, principal string
			teams            []string
		}{{alice, "alice", []string{"ops"}}, {bob, "bob", nil}} {
			cs := mcpHTTPClient(t, p.ctx, endpoint, c.token)
			res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "calculator", Arguments: map[string]any{"expression": "6*7"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.IsError || !strings.Contains(resultText(res), "42") {
				t.Fatalf("calculator(6*7) = isError %v, %q", res.IsError, resultText(res))
			}
			run, _ := res.Meta[mcpserver.MetaRun].(string)
			rs, err := p.bus.RunStarted(p.ctx, run)
			if err != nil {
				t.Fatalf("run %q of the call: %v", run, err)
			}
			if rs.Principal.ID != c.principal || strings.Join(rs.Principal.Roles, ",") != strings.Join(c.teams, ",") {
				t.Fatalf("run %s acts for %+v, want %s %v", run, rs.Principal, c.principal, c.teams)
			}
			cs.Close()
		}
	})

	t.Run("session bound to its principal", func(t *testing.T) {
		resp := mcpPost(t, endpoint, alice, "", mcpInitialize, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		sid := resp.Header.Get("Mcp-Session-Id")
		if sid == "" {
			t.Fatal("initialize gave no session id")
		}
		resp = mcpPost(t, endpoint, bob, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("bob used alice's session: status %d: %s", resp.StatusCode, body)
		}
	})

	t.Run("cancelled request not answered", func(t *testing.T) {
		resp := mcpPost(t, endpoint, alice, "", mcpInitialize, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		sid := resp.Header.Get("Mcp-Session-Id")
		resp = mcpPost(t, endpoint, alice, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)
		resp.Body.Close()
		before, err := p.bus.Store().Runs(p.ctx)
		if err != nil {
			t.Fatal(err)
		}
		answer := make(chan string, 1)
		go func() {
			resp := mcpPost(t, endpoint, alice, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":60000}}}`, nil)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answer <- string(b)
		}()
		// The call is a run on the bus: wait until its sleep is requested, then cancel it.
		var run string
		eventstest.Eventually(t, 30*time.Second, func() error {
			runs, err := p.bus.Store().Runs(p.ctx)
			if err != nil {
				return err
			}
			for _, st := range runs {
				if strings.HasPrefix(st.RunID, "mcp-") && !slices.ContainsFunc(before, func(b store.RunState) bool { return b.RunID == st.RunID }) {
					run = st.RunID
				}
			}
			if run == "" {
				return errors.New("no run for the call yet")
			}
			return nil
		})
		p.waitEvent(run, events.TypeToolRequested)
		resp = mcpPost(t, endpoint, alice, sid, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user stopped it"}}`, nil)
		resp.Body.Close()
		select {
		case got := <-answer:
			if strings.Contains(got, `"id":7`) {
				t.Fatalf("the cancelled request was answered: %s", got)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the stream of the cancelled request stayed open")
		}
		// The run is cancelled with the call.
		p.waitStatus(run, toolbus.RunCancelled)
	})
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

// mcpHTTPClient connects a go-sdk client that sends token on every request.
func mcpHTTPClient(t *testing.T, ctx context.Context, endpoint, token string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: bearerTransport{token: token}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}
