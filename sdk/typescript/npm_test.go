package typescript_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// The TypeScript package's own tests (npm test: node's test runner) against a real NATS
// JetStream server with toolbus's stream and buckets and the pipeline's roles, started
// here (as testbus starts them for a standalone npm test). Without Node or the
// package's install (npm ci --prefix sdk/typescript) the test is skipped on a developer
// machine and fails under CI (CI set), where make test installs it.
func TestNPMTest(t *testing.T) {
	npm := needNPM(t)
	// What testbus runs for a standalone npm test: a planner of pre-planned runs (a run
	// that needs a model waits: the executor tests drive their runs call by call), an
	// injector (its decision policy: a run's principal and approvers, and ops) and a Go
	// executor of the demo and diag packs.
	model := planner.ModelFunc(func(ctx context.Context, _ planner.Request) (planner.Response, error) {
		<-ctx.Done()
		return planner.Response{}, ctx.Err()
	})
	p := testpipe.StartWith(t, 4*time.Minute, model, testpipe.Options{Deciders: []string{"ops"}})
	ctx, cancel := context.WithTimeout(p.Ctx, 3*time.Minute)
	defer cancel()
	// The team-account tests run in TestNPMTeamAccount, on a server of two accounts.
	nodeTest(t, ctx, []string{"TOOLBUS_TEST_NATS_URL=" + p.Srv.URL, "TOOLBUS_TEST_SKIP_TEAM=1"}, npm, "test")
}

// needNPM returns npm once the package is installed; without it the test is skipped on
// a developer machine and fails under CI.
func needNPM(t *testing.T) string {
	t.Helper()
	testutil.NeedNPMPackage(t, ".", "node_modules/typescript/package.json")
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal(err)
	}
	return npm
}

// nodeTest runs a command of node's test runner with env added; it fails unless every
// test passed and at least one ran.
func nodeTest(t *testing.T, ctx context.Context, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	// A run that executed no test is no pass.
	if !strings.Contains(string(out), "# pass ") || strings.Contains(string(out), "# pass 0\n") {
		t.Fatalf("%s %v ran no test:\n%s", name, args, out)
	}
	t.Logf("%s", out[max(0, len(out)-400):])
}

// teamTools are the tools the core exports to the team account alpha: the ones
// test/team.test.ts serves (testbus.TeamTools for a standalone npm test).
var teamTools = []string{"team_count", "team_pay", "team_hang"}

// TestNPMTeamAccount runs the package's team-account tests (test/team*.test.ts): its
// executor in the team account alpha of a two-account server (the accounts layout,
// events/intaketest.StartAccounts: the rendering TestTeamAccountExecutor uses), which
// reaches the core account's JetStream only under TOOLBUS_NATS_API_PREFIX and through
// the imports of its tools, whose queues are provisioned in the core, where the
// pipeline's roles run.
func TestNPMTeamAccount(t *testing.T) {
	npm := needNPM(t)
	// A process: the tests regrant (a reload) under running direct gets (eventstest.AccountsProcess).
	srv := eventstest.StartAccountsServer(t, "alpha", teamTools)
	intaketest.ServeIntake(t, srv.Connect(t, "core"), intake.Limits{})
	grants, err := srv.ServeGrants()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = grants.Close() })
	nc := srv.Connect(t, "core")
	model := planner.ModelFunc(func(ctx context.Context, _ planner.Request) (planner.Response, error) {
		<-ctx.Done()
		return planner.Response{}, ctx.Err()
	})
	p := testpipe.StartOn(t, nc, 4*time.Minute, model)
	// The read service (in every `toolbus injector`): a team reads through it where a
	// bucket serves no direct gets (test/team-replicated.test.ts).
	p.Roles.Go("reads", reads.New(p.Bus, p.Log).Serve)
	for _, tool := range teamTools {
		if _, err := provision.Consumer(p.Ctx, p.Bus, provision.ToolConsumerConfig(tool, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	tb, err := json.Marshal(map[string]any{"url": srv.URL, "core_user": "core", "core_password": "core",
		"team_user": "alpha", "team_password": "alpha", "team_name": "alpha", "api_prefix": eventstest.TeamAPIPrefix, "tools": teamTools,
		"grant_url": "http://" + grants.Addr().String() + "/grant"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(p.Ctx, 3*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, npm, "run", "build")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("npm run build: %v\n%s", err, out)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
	}
	// One file at a time: they serve the same tools on the one server.
	nodeTest(t, ctx, []string{"TOOLBUS_TEST_TEAM_BUS=" + string(tb)}, node, "--test", "--test-concurrency=1",
		filepath.Join("dist", "test", "team.test.js"), filepath.Join("dist", "test", "team-fleet.test.js"),
		filepath.Join("dist", "test", "team-replicated.test.js"))
}
