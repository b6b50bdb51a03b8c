package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
)

// TestMCPServerSeesNoToolbusSecrets starts server-everything over stdio from a
// configuration, as `toolbus executor` does with TOOLBUS_MCP_CONFIG, in a process whose
// environment holds toolbus's NATS credentials, and calls its get-env tool, which prints
// the server's whole environment: the server gets PATH, HOME and what its entry names,
// never a TOOLBUS_* or NATS variable; a secret value an operator passed on anyway is
// redacted by value before the model (or the console) reads it. The entry's policy
// decides which tools are served, which need approval and their timeout.
func TestMCPServerSeesNoToolbusSecrets(t *testing.T) {
	mods := mcpModules(t)
	natsPassword := "n4ts-" + strings.Repeat("Pw", 8) // matches no redaction pattern
	t.Setenv("TOOLBUS_NATS_PASSWORD", natsPassword)
	t.Setenv("TOOLBUS_NATS_USER", "executor")
	t.Setenv("NATS_TOKEN", "t0ken-"+strings.Repeat("x", 12))
	t.Setenv("DOORS_TEST_KEY", "api-key-for-the-server")
	cfg := mcptools.Config{MCPServers: map[string]mcptools.Server{
		"everything": {
			Command: "node",
			Args:    []string{filepath.Join(mods, "@modelcontextprotocol", "server-everything", "dist", "index.js"), "stdio"},
			Env: map[string]string{
				"GREETING":   "hello",
				"SERVER_KEY": "${DOORS_TEST_KEY}",
				// An operator's mistake: toolbus's own password given to a tool literally.
				"OOPS": natsPassword,
			},
			Policy: mcptools.Policy{
				AllowTools: []string{"get-env", "echo", "get-sum"}, DenyTools: []string{"get-sum"},
				NeedsApproval: []string{"echo"}, Timeout: mcptools.Duration(7 * time.Second),
			},
		},
	}}
	reg := executor.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := mcptools.New(reg, cfg, mcptools.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	t.Run("policy", func(t *testing.T) {
		if got := strings.Join(p.Tools(), ","); got != "everything__echo,everything__get-env" {
			t.Fatalf("served tools %s, want everything__echo,everything__get-env (allowTools minus denyTools)", got)
		}
		echo, _ := reg.Lookup("everything__echo")
		env, _ := reg.Lookup("everything__get-env")
		if !echo.NeedsApproval || env.NeedsApproval {
			t.Errorf("needsApproval: echo %v, get-env %v; want true, false", echo.NeedsApproval, env.NeedsApproval)
		}
		if echo.Timeout != 7*time.Second || env.Timeout != 7*time.Second {
			t.Errorf("timeouts %v, %v; want 7s", echo.Timeout, env.Timeout)
		}
	})

	t.Run("environment", func(t *testing.T) {
		ex := must(executor.New(reg, executor.WithSecrets(natsPassword)))
		res := ex.Execute(ctx, toolbus.ToolCall{CallID: "c", Tool: "everything__get-env", Arguments: "{}"}, toolbus.Principal{ID: "p"})
		if res.Status != toolbus.StatusSucceeded {
			t.Fatalf("get-env: %s %s", res.Status, res.Content)
		}
		var env map[string]string
		if err := json.Unmarshal([]byte(res.Content), &env); err != nil {
			t.Fatalf("get-env printed no JSON object: %v\n%s", err, res.Content)
		}
		for k := range env {
			if strings.HasPrefix(k, "TOOLBUS_") || strings.HasPrefix(k, "NATS_") || k == "DOORS_TEST_KEY" {
				t.Errorf("the server got %s", k)
			}
		}
		if strings.Contains(res.Content, natsPassword) || strings.Contains(string(res.Output), natsPassword) {
			t.Errorf("the NATS password reached the result")
		}
		if env["OOPS"] != executor.Redacted {
			t.Errorf("OOPS = %q, want %s (redacted by value)", env["OOPS"], executor.Redacted)
		}
		if env["GREETING"] != "hello" || env["SERVER_KEY"] != "api-key-for-the-server" || env["PATH"] == "" {
			t.Errorf("GREETING %q, SERVER_KEY %q, PATH %q: want the entry's env, ${NAME} read from the executor's, and PATH", env["GREETING"], env["SERVER_KEY"], env["PATH"])
		}
	})
}

// TestMCPConfigRefusesToolbusVariables: an entry cannot hand a server the executor's own
// settings by reference.
func TestMCPConfigRefusesToolbusVariables(t *testing.T) {
	t.Parallel()
	for _, ref := range []string{"${TOOLBUS_NATS_PASSWORD}", "${NATS_TOKEN}", "${toolbus_nats_user}"} {
		_, err := mcptools.New(executor.NewRegistry(), mcptools.Config{MCPServers: map[string]mcptools.Server{
			"s": {Command: "node", Env: map[string]string{"X": ref}},
		}}, mcptools.Options{})
		if err == nil || !strings.Contains(err.Error(), "never given to a tool") {
			t.Errorf("env X=%s: err %v, want a refusal", ref, err)
		}
	}
}
