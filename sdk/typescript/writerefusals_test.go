package typescript_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// TestNPMWriteRefusals runs the package's tests of the write service's refusals
// (test/write-refusals.test.ts): a server of the accounts layout with the team account
// alpha (granted the tool team_flood, whose queue is provisioned in the core) and the
// client account carol (bound to carol), whose core's write service bounds each tenant
// (intaketest.StartTenantsLimited): small starts, a small bytes per second and burst,
// and two keys of the tool in the outputs bucket, so that the TypeScript client and
// executor meet each refusal for real.
func TestNPMWriteRefusals(t *testing.T) {
	npm := needNPM(t)
	lim := intake.Limits{BytesPerSecond: 1000, Burst: 20_000, MaxStartBytes: 8 << 10,
		Buckets: map[string]intake.BucketBound{store.BucketOutputs: {Keys: 2}}}
	const team, tool, client = "alpha", "team_flood", "carol"
	srv := intaketest.StartTenantsLimited(t, map[string][]string{team: {tool}}, map[string][]string{client: {client}}, lim)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	core := eventstest.Connect(t, srv, "core")
	if _, _, err := provision.Setup(ctx, core, events.Config{}, provision.WithTools([]string{tool}, 0, 0)); err != nil {
		t.Fatal(err)
	}
	lb, err := json.Marshal(map[string]any{"url": srv.ClientURL(), "core_user": "core", "core_password": "core",
		"team_user": team, "team_password": team, "team_name": team, "api_prefix": eventstest.TeamAPIPrefix, "tool": tool,
		"client_user": client, "client_password": client,
		"max_start_bytes": lim.MaxStartBytes, "bytes_per_second": lim.BytesPerSecond, "burst": lim.Burst,
		"output_keys": lim.Buckets[store.BucketOutputs].Keys})
	if err != nil {
		t.Fatal(err)
	}
	build := exec.CommandContext(ctx, npm, "run", "build")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("npm run build: %v\n%s", err, out)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
	}
	// One test at a time: the tests spend the tenants' budgets.
	nodeTest(t, ctx, []string{"TOOLBUS_TEST_LIMITED_BUS=" + string(lb)}, node, "--test", "--test-concurrency=1",
		filepath.Join("dist", "test", "write-refusals.test.js"))
}
