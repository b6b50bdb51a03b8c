package mcptools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/internal/testutil"
)

// fixture is an in-process go-sdk server reached over an in-memory pipe; every
// (re)connection gets a new server session, and crash breaks the current pipe.
type fixture struct {
	srv   *mcp.Server
	dials atomic.Int32
	mu    sync.Mutex
	ends  []net.Conn // the server's end of each connection's pipe
	// cancelled receives the name of a tool whose handler saw its context end (the SDK
	// delivers notifications/cancelled that way).
	cancelled chan string
	started   chan string
}

func schema(props string) json.RawMessage {
	return json.RawMessage(`{"type":"object","properties":{` + props + `},"additionalProperties":false}`)
}

func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{cancelled: make(chan string, 16), started: make(chan string, 16)}
	f.srv = mcp.NewServer(&mcp.Implementation{Name: "fixture", Version: "1"}, nil)
	f.srv.AddTool(&mcp.Tool{Name: "echo", Description: "Echoes text.", InputSchema: schema(`"text":{"type":"string"}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in struct{ Text string }
			if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
				return nil, err
			}
			return textResult("echo: " + in.Text), nil
		})
	f.srv.AddTool(&mcp.Tool{Name: "add", Description: "Adds.", InputSchema: schema(`"a":{"type":"number"},"b":{"type":"number"}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in struct{ A, B float64 }
			if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
				return nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(in.A + in.B)}},
				StructuredContent: map[string]any{"sum": in.A + in.B}}, nil
		})
	f.srv.AddTool(&mcp.Tool{Name: "fail", Description: "Always fails.", InputSchema: schema("")},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			r := textResult("disk quota exceeded on /data")
			r.IsError = true
			return r, nil
		})
	f.srv.AddTool(&mcp.Tool{Name: "picture", Description: "Returns an image and a resource.", InputSchema: schema("")},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{
				&mcp.TextContent{Text: "here it is"},
				&mcp.ImageContent{MIMEType: "image/png", Data: []byte("12345")},
				&mcp.AudioContent{MIMEType: "audio/wav", Data: []byte("RIFF")},
				&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "mem://c.pdf", MIMEType: "application/pdf", Blob: []byte("%PDF")}},
				&mcp.ResourceLink{URI: "file:///tmp/a.txt", Name: "a.txt"},
				&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "mem://b", MIMEType: "text/plain", Text: "inner text"}},
			}}, nil
		})
	f.srv.AddTool(&mcp.Tool{Name: "slow", Description: "Waits until cancelled.", InputSchema: schema("")},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			f.started <- "slow"
			<-ctx.Done()
			f.cancelled <- "slow"
			return nil, ctx.Err()
		})
	f.srv.AddTool(&mcp.Tool{Name: "broken", Description: "Its handler errs.", InputSchema: schema("")},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "handler exploded"}
		})
	f.srv.AddTool(&mcp.Tool{Name: "bad.name/x", Description: "Odd name.", InputSchema: schema("")},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return textResult("odd"), nil
		})
	return f
}

// dial is mcp.NewInMemoryTransports with the server's end of the pipe kept, so crash
// can break it.
func (f *fixture) dial(ctx context.Context) (mcp.Transport, error) {
	f.dials.Add(1)
	cEnd, sEnd := net.Pipe()
	if _, err := f.srv.Connect(ctx, &mcp.IOTransport{Reader: sEnd, Writer: sEnd}, nil); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.ends = append(f.ends, sEnd)
	f.mu.Unlock()
	return &mcp.IOTransport{Reader: cEnd, Writer: cEnd}, nil
}

// crash closes the server's end of the current pipe, as a stdio server that dies closes
// its stdout: the client reads EOF at once. Not ServerSession.Close: that close is
// graceful, it closes the stream only once the handlers in flight have returned, and the
// slow tool returns only when cancelled; it got cancelled only when the response of the
// cancelled subscriptions/listen happened to be written after the close began, so a call
// in flight sometimes ran into its 30s timeout.
func (f *fixture) crash() {
	f.mu.Lock()
	end := f.ends[len(f.ends)-1]
	f.mu.Unlock()
	_ = end.Close()
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, f *fixture, onChange func(context.Context) error, setup ...func(*mcptools.Provider)) (*executor.Registry, *executor.Executor) {
	t.Helper()
	reg := executor.NewRegistry()
	p, err := mcptools.New(reg, mcptools.Config{}, mcptools.Options{Logger: quietLog(), OnChange: onChange, MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range setup {
		f(p)
	}
	p.AddServer("fx", f.dial)
	if err := p.Start(eventstest.Context(t, 2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return reg, testutil.Must(executor.New(reg, executor.WithLogger(quietLog())))
}

func call(ctx context.Context, ex *executor.Executor, tool, args string) toolbus.ToolResult {
	return ex.Execute(ctx, toolbus.ToolCall{CallID: "c1", Tool: tool, Arguments: args}, toolbus.Principal{ID: "t"})
}

func TestCatalog(t *testing.T) {
	reg, _ := start(t, newFixture(t), nil)
	want := []string{"fx__add", "fx__bad_name_x", "fx__broken", "fx__echo", "fx__fail", "fx__picture", "fx__slow"}
	if got := reg.Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("names = %v, want %v", got, want)
	}
	echo, _ := reg.Lookup("fx__echo")
	if echo.Description != "Echoes text." || !echo.ReadOnly {
		t.Errorf("echo = %+v: description and readOnlyHint not carried", echo)
	}
	var s struct {
		Properties map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(echo.InputSchema, &s); err != nil || s.Properties["text"] == nil {
		t.Errorf("echo schema %s lacks the server's text property (%v)", echo.InputSchema, err)
	}
	if add, _ := reg.Lookup("fx__add"); add.ReadOnly {
		t.Error("add has no readOnlyHint but is read-only")
	}
}

func TestCall(t *testing.T) {
	_, ex := start(t, newFixture(t), nil)
	ctx := eventstest.Context(t, time.Minute)
	tests := []struct {
		name, tool, args string
		status           toolbus.Status
		code             string
		content          []string // substrings of what the model reads
		files            []toolbus.Attachment
		output           string
	}{
		{name: "text", tool: "fx__echo", args: `{"text":"hi"}`, status: toolbus.StatusSucceeded, content: []string{"echo: hi"}, output: `"echo: hi"`},
		{name: "structured", tool: "fx__add", args: `{"a":2,"b":3}`, status: toolbus.StatusSucceeded, content: []string{`"sum":5`}, output: `{"sum":5}`},
		{name: "isError", tool: "fx__fail", args: `{}`, status: toolbus.StatusFailed, code: toolbus.CodeToolError, content: []string{"disk quota exceeded on /data"}},
		{name: "media passed through", tool: "fx__picture", args: `{}`, status: toolbus.StatusSucceeded,
			content: []string{"here it is", "[resource link: a.txt <file:///tmp/a.txt>]", "[resource mem://b]", "inner text"},
			files: []toolbus.Attachment{{MediaType: "image/png", Data: []byte("12345"), Size: 5}, {MediaType: "audio/wav", Data: []byte("RIFF"), Size: 4},
				{MediaType: "application/pdf", URI: "mem://c.pdf", Data: []byte("%PDF"), Size: 4}}},
		{name: "schema from server", tool: "fx__echo", args: `{"text":1}`, status: toolbus.StatusRejected, code: toolbus.CodeInvalidArguments},
		{name: "protocol error", tool: "fx__broken", args: `{}`, status: toolbus.StatusFailed, code: mcptools.CodeProtocol, content: []string{"handler exploded", `"retryable":true`}},
		{name: "renamed tool", tool: "fx__bad_name_x", args: `{}`, status: toolbus.StatusSucceeded, content: []string{"odd"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := call(ctx, ex, tc.tool, tc.args)
			if res.Status != tc.status || res.Code() != tc.code {
				t.Fatalf("status %s code %q, want %s %q: %+v", res.Status, res.Code(), tc.status, tc.code, res)
			}
			for _, c := range tc.content {
				if !strings.Contains(res.Content, c) {
					t.Errorf("content %q lacks %q", res.Content, c)
				}
			}
			if tc.output != "" && string(res.Output) != tc.output {
				t.Errorf("output %s, want %s", res.Output, tc.output)
			}
			if !reflect.DeepEqual(res.Attachments, tc.files) {
				t.Errorf("attachments %+v, want %+v", res.Attachments, tc.files)
			}
			if strings.Contains(res.Content, "[image:") || strings.Contains(res.Content, "[audio:") {
				t.Errorf("content %q describes media that passed through", res.Content)
			}
		})
	}
}

func TestTimeoutAndCancellationReachTheServer(t *testing.T) {
	f := newFixture(t)
	_, ex := start(t, f, nil)
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(eventstest.Context(t, time.Minute), 300*time.Millisecond)
		defer cancel()
		res := call(ctx, ex, "fx__slow", `{}`)
		if res.Status != toolbus.StatusTimedOut {
			t.Fatalf("status %s, want timed_out: %+v", res.Status, res)
		}
		waitFor(t, f.started, "the call never reached the server")
		waitFor(t, f.cancelled, "the server never saw the call cancelled after its deadline")
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(eventstest.Context(t, time.Minute))
		done := make(chan toolbus.ToolResult, 1)
		go func() { done <- call(ctx, ex, "fx__slow", `{}`) }()
		waitFor(t, f.started, "the call never reached the server")
		cancel()
		res := <-done
		if res.Status != toolbus.StatusCancelled {
			t.Fatalf("status %s, want cancelled: %+v", res.Status, res)
		}
		waitFor(t, f.cancelled, "the server never saw notifications/cancelled")
	})
}

func waitFor(t *testing.T, ch chan string, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal(msg)
	}
}

func TestListChanged(t *testing.T) {
	f := newFixture(t)
	var changes atomic.Int32
	reg, ex := start(t, f, func(context.Context) error { changes.Add(1); return nil })
	f.srv.AddTool(&mcp.Tool{Name: "late", Description: "Added later.", InputSchema: schema("")},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return textResult("late result"), nil
		})
	eventstest.Eventually(t, 30*time.Second, func() error {
		if _, ok := reg.Lookup("fx__late"); !ok {
			return errors.New("fx__late not registered yet")
		}
		return nil
	})
	if res := call(eventstest.Context(t, time.Minute), ex, "fx__late", `{}`); res.Content != "late result" {
		t.Fatalf("late tool: %+v", res)
	}
	f.srv.RemoveTools("echo")
	eventstest.Eventually(t, 30*time.Second, func() error {
		if _, ok := reg.Lookup("fx__echo"); ok {
			return errors.New("fx__echo still registered")
		}
		return nil
	})
	if changes.Load() < 2 {
		t.Errorf("OnChange called %d times, want at least 2", changes.Load())
	}
}

func TestCrashAndRestart(t *testing.T) {
	f := newFixture(t)
	_, ex := start(t, f, nil)
	ctx := eventstest.Context(t, time.Minute)
	done := make(chan toolbus.ToolResult, 1)
	go func() { done <- call(ctx, ex, "fx__slow", `{}`) }()
	waitFor(t, f.started, "the call never reached the server")
	f.crash()
	var res toolbus.ToolResult
	select {
	case res = <-done:
	case <-time.After(10 * time.Second): // well under the tool's 30s timeout
		t.Fatal("the call in flight during the crash did not end promptly")
	}
	if res.Status != toolbus.StatusFailed || res.Code() != mcptools.CodeUnavailable || res.Error == nil || !res.Error.Retryable {
		t.Fatalf("call in flight during the crash: %+v, want a retryable %s failure", res, mcptools.CodeUnavailable)
	}
	// Later calls work again once the provider reconnected.
	eventstest.Eventually(t, 30*time.Second, func() error {
		if res := call(ctx, ex, "fx__echo", `{"text":"again"}`); res.Status != toolbus.StatusSucceeded {
			return fmt.Errorf("after restart: %+v", res)
		}
		return nil
	})
	if n := f.dials.Load(); n < 2 {
		t.Fatalf("dialled %d times, want a reconnection", n)
	}
}

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name, body string
		ok         bool
	}{
		{"stdio and http", `{"mcpServers":{"fs":{"command":"npx","args":["-y","x"],"env":{"A":"1"}},"web":{"url":"http://127.0.0.1:1/mcp","headers":{"Authorization":"Bearer t"}}}}`, true},
		{"neither", `{"mcpServers":{"x":{}}}`, false},
		{"both", `{"mcpServers":{"x":{"command":"a","url":"http://b"}}}`, false},
		{"not json", `{`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := t.TempDir() + "/mcp.json"
			if err := writeFile(path, tc.body); err != nil {
				t.Fatal(err)
			}
			c, err := mcptools.LoadConfig(path)
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok && !errors.Is(err, mcptools.ErrConfig) {
				t.Errorf("err %v does not wrap ErrConfig", err)
			}
			if tc.ok && c.MCPServers["fs"].Args[1] != "x" {
				t.Errorf("config %+v", c)
			}
		})
	}
}

// A call made after the server died but before the provider noticed (the supervisor
// held here) was never written to the dead connection: it waits for the reconnection
// and runs there, instead of failing.
func TestCallBetweenCrashAndNoticeWaitsForTheRestart(t *testing.T) {
	f := newFixture(t)
	ended, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	_, ex := start(t, f, nil, func(p *mcptools.Provider) {
		p.OnSessionEnded(func() {
			once.Do(func() {
				close(ended)
				<-release
			})
		})
	})
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the provider's Close (cleanups run last first)
	ctx := eventstest.Context(t, time.Minute)
	if res := call(ctx, ex, "fx__echo", `{"text":"before"}`); res.Status != toolbus.StatusSucceeded {
		t.Fatalf("before the crash: %+v", res)
	}
	f.crash()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the session's end was never seen")
	}
	done := make(chan toolbus.ToolResult, 1)
	go func() { done <- call(ctx, ex, "fx__echo", `{"text":"after"}`) }()
	select {
	case res := <-done:
		t.Fatalf("the call ended before the provider reconnected: %+v", res)
	case <-time.After(200 * time.Millisecond): // it waits (a failure would come at once; the check below catches it too)
	}
	unblock()
	select {
	case res := <-done:
		if res.Status != toolbus.StatusSucceeded || res.Content != "echo: after" {
			t.Fatalf("the call after the crash: %+v, want it run on the new session", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the call never ran")
	}
	if n := f.dials.Load(); n != 2 {
		t.Fatalf("dialled %d times, want one reconnection", n)
	}
}
