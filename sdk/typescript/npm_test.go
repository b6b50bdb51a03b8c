package typescript_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/internal/testpipe"
	"github.com/toolbus/toolbus/planner"
)

// The TypeScript package's own tests (npm test: node's test runner) against a real NATS
// JetStream server with toolbus's stream and buckets and the pipeline's roles, started
// here (as testbus starts them for a standalone npm test). Without Node or the
// package's install (npm ci --prefix sdk/typescript) the test is skipped on a developer
// machine and fails under CI (CI set), where .ci/run installs it.
func TestNPMTest(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err == nil {
		_, err = os.Stat(filepath.Join("node_modules", "typescript", "package.json"))
	}
	if err != nil {
		msg := "the TypeScript package is not installed (npm ci --prefix sdk/typescript): " + err.Error()
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// What testbus runs for a standalone npm test: a planner of pre-planned runs (a run
	// that needs a model waits: the executor tests drive their runs call by call), an
	// injector and a Go executor of the demo and diag packs.
	model := planner.ModelFunc(func(ctx context.Context, _ planner.Request) (planner.Response, error) {
		<-ctx.Done()
		return planner.Response{}, ctx.Err()
	})
	p := testpipe.Start(t, 4*time.Minute, model)
	ctx, cancel := context.WithTimeout(p.Ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "test")
	cmd.Env = append(os.Environ(), "TOOLBUS_TEST_NATS_URL="+p.Srv.URL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("npm test: %v\n%s", err, out)
	}
	// A run that executed no test is no pass.
	if !strings.Contains(string(out), "# pass ") || strings.Contains(string(out), "# pass 0\n") {
		t.Fatalf("npm test ran no test:\n%s", out)
	}
	t.Logf("%s", out[max(0, len(out)-400):])
}
