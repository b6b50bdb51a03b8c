package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// mcpModules returns tools/mcp-servers/node_modules, where `npm ci --prefix
// tools/mcp-servers` installs the third-party MCP servers these tests run. Without it
// the tests skip, except under CI, where a missing install is a failure.
func mcpModules(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "tools", "mcp-servers", "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.NeedNPMPackage(t, filepath.Join("..", "tools", "mcp-servers"), "node_modules/@modelcontextprotocol/server-everything")
	return dir
}

// stdioServer dials a node MCP server over stdio and remembers its processes, so a test
// can kill the current one.
type stdioServer struct {
	script string
	args   []string
	mu     sync.Mutex
	procs  []*exec.Cmd
}

func (s *stdioServer) dial(context.Context) (mcp.Transport, error) {
	cmd := exec.Command("node", append([]string{s.script}, s.args...)...)
	s.mu.Lock()
	s.procs = append(s.procs, cmd)
	s.mu.Unlock()
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Second}, nil
}

// kill kills the latest process once it runs.
func (s *stdioServer) kill(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	cmd := s.procs[len(s.procs)-1]
	s.mu.Unlock()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
}

func (s *stdioServer) starts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.procs)
}

// startMCP registers the tools of server-everything ("everything__") and of
// server-filesystem on root ("fs__") in the stack's registry, before its executor starts.
func startMCP(t *testing.T, s *stack, root string) (everything *stdioServer) {
	t.Helper()
	mods := mcpModules(t)
	everything = &stdioServer{script: filepath.Join(mods, "@modelcontextprotocol", "server-everything", "dist", "index.js"), args: []string{"stdio"}}
	fs := &stdioServer{script: filepath.Join(mods, "@modelcontextprotocol", "server-filesystem", "dist", "index.js"), args: []string{root}}
	p, err := mcptools.New(s.reg, mcptools.Config{}, mcptools.Options{Logger: s.log, MinBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p.AddServer("everything", everything.dial)
	p.AddServer("fs", fs.dial)
	if err := p.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return everything
}

func TestMCPServersInPipeline(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "hello.txt"), []byte("hello from the filesystem server"), 0o600); err != nil {
		t.Fatal(err)
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(
			call("c_echo", "everything__echo", `{"message":"over the bus"}`),
			call("c_sum", "everything__get-sum", `{"a":2,"b":40}`),
			call("c_read", "fs__read_text_file", `{"path":"`+filepath.Join(root, "hello.txt")+`"}`),
			call("c_outside", "fs__read_text_file", `{"path":"/etc/hostname"}`),
		),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	startMCP(t, s, root)
	s.startAll()
	s.submit("mcp-1", toolbus.Limits{})
	if ended := s.waitEnd("mcp-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("run %s (%s), want completed", ended.Status, ended.Reason)
	}
	got := map[string]toolbus.ToolResult{}
	for _, f := range s.finished("mcp-1") {
		got[f.ToolResult.CallID] = f.ToolResult
	}
	want := []struct {
		id      string
		status  toolbus.Status
		content string
	}{
		{"c_echo", toolbus.StatusSucceeded, "Echo: over the bus"},
		{"c_sum", toolbus.StatusSucceeded, "42"},
		{"c_read", toolbus.StatusSucceeded, "hello from the filesystem server"},
		// Outside the allowed directory: the server answers isError, a tool_error.
		{"c_outside", toolbus.StatusFailed, "ccess denied"},
	}
	for _, w := range want {
		r, ok := got[w.id]
		if !ok {
			t.Errorf("no result for %s", w.id)
			continue
		}
		if r.Status != w.status || !strings.Contains(r.Content, w.content) {
			t.Errorf("%s: %s %q, want %s containing %q", w.id, r.Status, r.Content, w.status, w.content)
		}
		if w.status == toolbus.StatusFailed && r.Code() != toolbus.CodeToolError {
			t.Errorf("%s: code %q, want %s", w.id, r.Code(), toolbus.CodeToolError)
		}
	}
}

func TestMCPServerKilledMidRun(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(
			call("c_long", "everything__trigger-long-running-operation", `{"duration":20,"steps":20}`),
			call("c_echo0", "everything__echo", `{"message":"before"}`),
		),
		planner.Calls(call("c_echo1", "everything__echo", `{"message":"after the restart"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	everything := startMCP(t, s, t.TempDir())
	s.startAll()
	s.submit("mcp-kill", toolbus.Limits{})
	// Kill the server once the long call was requested (it runs 20s, so it is then
	// normally in flight; if not, it waits for the restarted server instead).
	eventstest.Eventually(t, 60*time.Second, func() error {
		for _, e := range s.runEvents("mcp-kill") {
			if e.Meta.Type == events.TypeToolRequested && e.Meta.CallID == "c_long" {
				return nil
			}
		}
		return context.DeadlineExceeded
	})
	everything.kill(t)
	ended := s.waitEnd("mcp-kill")
	if ended.Status != toolbus.RunCompleted {
		t.Fatalf("run %s (%s), want completed", ended.Status, ended.Reason)
	}
	got := map[string]toolbus.ToolResult{}
	for _, f := range s.finished("mcp-kill") {
		got[f.ToolResult.CallID] = f.ToolResult
	}
	for _, id := range []string{"c_long", "c_echo0", "c_echo1"} {
		if _, ok := got[id]; !ok {
			t.Errorf("call %s has no result", id)
		}
	}
	t.Logf("long call during the kill: %s %q", got["c_long"].Status, got["c_long"].Content)
	if r := got["c_long"]; r.Status != toolbus.StatusSucceeded && (r.Code() != mcptools.CodeUnavailable || !r.Error.Retryable) {
		t.Errorf("long call: %s %q, want succeeded or a retryable %s", r.Status, r.Content, mcptools.CodeUnavailable)
	}
	if r := got["c_echo1"]; r.Status != toolbus.StatusSucceeded || !strings.Contains(r.Content, "Echo: after the restart") {
		t.Errorf("call after the restart: %s %q", r.Status, r.Content)
	}
	if n := everything.starts(); n < 2 {
		t.Errorf("server-everything started %d times, want a restart", n)
	}
}

// TestMCPListChangedReachesCatalog: a tool an MCP server adds while the executor runs
// enters the catalog and is served (its queue starts); a tool it removes leaves the
// tools offered to models. The server is an in-process go-sdk server.
func TestMCPListChangedReachesCatalog(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("c_late", "mem__late", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	srv := mcp.NewServer(&mcp.Implementation{Name: "mem", Version: "1"}, nil)
	obj := json.RawMessage(`{"type":"object"}`)
	srv.AddTool(&mcp.Tool{Name: "early", Description: "There from the start.", InputSchema: obj},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "early"}}}, nil
		})
	exec := must(executor.New(s.reg, executor.WithLogger(s.log), executor.WithInstance("mcp-exec")))
	w := must(worker.New(s.bus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "mcp-exec", Logger: s.log, Grace: time.Second}}))
	p, err := mcptools.New(s.reg, mcptools.Config{}, mcptools.Options{Logger: s.log, OnChange: w.Sync})
	if err != nil {
		t.Fatal(err)
	}
	p.AddServer("mem", func(ctx context.Context) (mcp.Transport, error) {
		ct, st := mcp.NewInMemoryTransports()
		if _, err := srv.Connect(ctx, st, nil); err != nil {
			return nil, err
		}
		return ct, nil
	})
	if err := p.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	s.start("mcp-exec", w.Run)
	cat, err := s.bus.Store().WatchCatalog(s.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	offered := func(name string) bool {
		for _, c := range cat.Tools(nil) {
			if c.Name == name {
				return true
			}
		}
		return false
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		if !offered("mem__early") {
			return errors.New("mem__early not offered yet")
		}
		return nil
	})
	srv.AddTool(&mcp.Tool{Name: "late", Description: "Added while serving.", InputSchema: obj},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "late answer"}}}, nil
		})
	srv.RemoveTools("early")
	eventstest.Eventually(t, 30*time.Second, func() error {
		if !offered("mem__late") || offered("mem__early") {
			return fmt.Errorf("offered late=%v early=%v, want true false", offered("mem__late"), offered("mem__early"))
		}
		return nil
	})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	s.submit("mcp-late", toolbus.Limits{})
	if ended := s.waitEnd("mcp-late"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("run %s (%s)", ended.Status, ended.Reason)
	}
	res := s.finished("mcp-late")
	if len(res) != 1 || res[0].ToolResult.Status != toolbus.StatusSucceeded || res[0].ToolResult.Content != "late answer" {
		t.Fatalf("results %+v, want the late tool's answer", res)
	}
}
