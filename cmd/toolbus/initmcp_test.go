package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	natsserver "github.com/nats-io/nats-server/v2/test"

	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/events/eventstest"
)

// mcpFixtureConfig serves an MCP server with two tools over streamable HTTP and writes
// a TOOLBUS_MCP_CONFIG naming it "files".
func mcpFixtureConfig(t *testing.T) string {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "files", Version: "1"}, nil)
	for _, name := range []string{"read_file", "list_dir"} {
		srv.AddTool(&mcp.Tool{Name: name, Description: name, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + " ok"}}}, nil
			})
	}
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	path := filepath.Join(t.TempDir(), "mcp.json")
	cfg := fmt.Sprintf(`{"mcpServers":{"files":{"url":%q}}}`, hs.URL)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runAs runs the command line with the NATS user set.
func runAs(ctx context.Context, user string, args ...string) (int, string, string) {
	os.Setenv("TOOLBUS_NATS_USER", user)
	os.Setenv("TOOLBUS_NATS_PASSWORD", user)
	var out, errOut bytes.Buffer
	code := run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestInitCreatesEveryQueue: `toolbus init` creates the queues of the packs and of the
// MCP servers of TOOLBUS_MCP_CONFIG; an executor whose credentials may not create
// consumers and lacks queues names every missing tool and the one init command that
// creates them, after which it starts.
func TestInitCreatesEveryQueue(t *testing.T) {
	opts := natsserver.DefaultTestOptions
	opts.Port, opts.JetStream, opts.StoreDir = -1, true, t.TempDir()
	deny := []string{"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>"}
	opts.Users = []*server.User{
		{Username: "admin", Password: "admin"},
		{Username: "exec", Password: "exec", Permissions: &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny}}},
	}
	ns := natsserver.RunServer(&opts)
	t.Cleanup(ns.Shutdown)
	t.Setenv("TOOLBUS_NATS_URL", ns.ClientURL())
	t.Setenv("TOOLBUS_NATS_USER", "")
	t.Setenv("TOOLBUS_NATS_PASSWORD", "")
	t.Setenv("TOOLBUS_LOG_LEVEL", "")
	t.Setenv("TOOLBUS_EXECUTOR_TOOLS", "")
	t.Setenv("TOOLBUS_MCP_CONFIG", mcpFixtureConfig(t))
	ctx := eventstest.Context(t, 3*time.Minute)

	t.Setenv("TOOLBUS_TOOLS", "demo")
	code, out, errOut := runAs(ctx, "admin", "init")
	wantCode(t, "init", code, 0, out, errOut)
	wantContains(t, "init", out, "created consumer tool_calculator", "created consumer tool_files__read_file", "created consumer tool_files__list_dir")

	// The executor serves diag too, whose queues init has not created.
	t.Setenv("TOOLBUS_TOOLS", "demo,diag")
	t.Setenv("TOOLBUS_INSTANCE", "exec-least")
	code, out, errOut = runAs(ctx, "exec", "executor")
	wantCode(t, "executor without its queues", code, 1, out, errOut)
	reg, err := node.NewRegistry(Config{Tools: "diag"})
	if err != nil {
		t.Fatal(err)
	}
	missing := reg.Names()
	wantContains(t, "executor error", errOut, fmt.Sprintf("the queues of %d tool(s) do not exist", len(missing)))
	i := strings.Index(errOut, "`toolbus init --tools ")
	if i < 0 {
		t.Fatalf("no init command in:\n%s", errOut)
	}
	cmdline := errOut[i+1:]
	cmdline = cmdline[:strings.Index(cmdline, "`")]
	listed := strings.Split(strings.TrimPrefix(cmdline, "toolbus init --tools "), ",")
	if !slices.Equal(slices.Sorted(slices.Values(listed)), slices.Sorted(slices.Values(missing))) {
		t.Fatalf("the command names %v, want every missing tool %v", listed, missing)
	}

	// The one command it names creates them all; the executor then starts.
	code, out, errOut = runAs(ctx, "admin", strings.Fields(cmdline)[1:]...)
	wantCode(t, cmdline, code, 0, out, errOut)
	os.Setenv("TOOLBUS_NATS_USER", "exec")
	os.Setenv("TOOLBUS_NATS_PASSWORD", "exec")
	cfg, err := node.Load()
	if err != nil {
		t.Fatal(err)
	}
	ectx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmdRole(ectx, cfg, cfg.Logger(), "executor") }()
	eventstest.Eventually(t, time.Minute, func() error {
		code, out, errOut := runAs(ctx, "admin", "tools", "--json")
		if code != 0 {
			return fmt.Errorf("tools: exit %d: %s", code, errOut)
		}
		var rows []callrun.ToolRow
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			return err
		}
		offered := map[string]bool{}
		for _, r := range rows {
			offered[r.Name] = r.Offered
		}
		for _, tool := range append(missing, "calculator", "files__read_file") {
			if !offered[tool] {
				return fmt.Errorf("%s not served yet: %s", tool, out)
			}
		}
		return nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("executor after its queues were created: %v", err)
	}
}
