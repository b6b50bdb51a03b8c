package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/conformance"
	"github.com/toolbus/toolbus/events/eventstest"
)

// run checks one executor on a fresh embedded JetStream server.
func run(t *testing.T, cfg conformance.Config) conformance.Report {
	t.Helper()
	bus := eventstest.RunJetStream(t)
	rep, err := conformance.Check(context.Background(), bus.Conn, bus.URL, cfg)
	if err != nil {
		t.Fatalf("%v\n---- executor ----\n%s", err, rep.Log)
	}
	return rep
}

func requireOK(t *testing.T, rep conformance.Report) {
	t.Helper()
	if !rep.OK() {
		t.Errorf("the executor breaks %d rule(s) of the contract:\n  %s\n---- executor ----\n%s",
			len(rep.Failures), strings.Join(rep.Failures, "\n  "), rep.Log)
	}
}

// The built-in Go executor (the toolbus binary) serving the diag pack's sleep tool.
func TestGoExecutor(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "toolbus")
	if out, err := exec.Command("go", "build", "-race", "-o", bin, "../cmd/toolbus").CombinedOutput(); err != nil {
		t.Fatalf("build toolbus: %v\n%s", err, out)
	}
	requireOK(t, run(t, conformance.Config{
		Command: []string{bin, "executor"}, Tool: "sleep",
		Env: []string{"TOOLBUS_TOOLS=diag", "TOOLBUS_EXECUTOR_TOOLS=sleep", "TOOLBUS_LOG_LEVEL=warn"},
	}))
}

// nodeExecutor returns the command of examples/node-executor, a program on the
// TypeScript package sdk/typescript (@toolbus/sdk). Without Node, the example's packages
// or the package's build (dist/, made by its npm ci) the test is skipped on a developer
// machine and fails under CI (CI set), where .ci/run installs and builds them.
func nodeExecutor(t *testing.T) []string {
	t.Helper()
	const dir = "../examples/node-executor"
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "@toolbus", "sdk", "dist", "src", "index.js"))
	}
	if err != nil {
		msg := "the Node executor's packages are not installed (npm ci --prefix sdk/typescript && npm ci --prefix examples/node-executor): " + err.Error()
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return []string{node, filepath.Join(dir, "executor.js")}
}

// The JavaScript executor of examples/node-executor, written from the contract alone.
func TestNodeExecutor(t *testing.T) {
	rep := run(t, conformance.Config{Command: nodeExecutor(t), Tool: "delay"})
	requireOK(t, rep)
	// It reports progress while it waits: the long call published tool.progress events,
	// which kept the rules (only while the call ran, in sequence).
	if rep.Progress == 0 {
		t.Fatal("the Node executor published no tool.progress during a call of several seconds")
	}
}

// The suite is not a formality: the Node executor with one rule broken fails it.
func TestNodeExecutorBroken(t *testing.T) {
	cases := []struct {
		breakRule string
		want      string
	}{
		{"two_results", "tool.finished published for one call, want exactly 1"},
		{"no_heartbeat", "the executor sent no heartbeats"},
	}
	cmd := nodeExecutor(t)
	for _, c := range cases {
		t.Run(c.breakRule, func(t *testing.T) {
			rep := run(t, conformance.Config{Command: cmd, Tool: "delay", Env: []string{"TOOLBUS_SDK_BREAK=" + c.breakRule}})
			if !strings.Contains(strings.Join(rep.Failures, "\n"), c.want) {
				t.Log(rep.Log)
				t.Fatalf("broken with %s, the report does not say %q:\n  %s", c.breakRule, c.want, strings.Join(rep.Failures, "\n  "))
			}
		})
	}
}
