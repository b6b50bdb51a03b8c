package typescript_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// TestNPMClientAccount runs the package's client-account tests (test/client-account.test.ts):
// the clients alice and bob, each in a client account of its own bound to the identity of
// its name (events/intaketest.StartTenants, the accounts layout), with
// readPrefix = events.ReadAPIPrefix(id), against the pipeline (planner of pre-planned
// runs, injector, a Go executor of the demo and diag packs) and the read service
// (package reads) in the core account. The accounts import no JetStream API, so every
// read the client makes goes through the read service or fails.
func TestNPMClientAccount(t *testing.T) {
	npm := needNPM(t)
	srv := intaketest.StartTenants(t, nil, map[string][]string{"alice": {"alice"}, "bob": {"bob"}})
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("core", "core"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	model := planner.ModelFunc(func(ctx context.Context, _ planner.Request) (planner.Response, error) {
		<-ctx.Done()
		return planner.Response{}, ctx.Err()
	})
	p := testpipe.StartOn(t, nc, 4*time.Minute, model)
	p.Roles.Go("reads", reads.New(p.Bus, p.Log).Serve)
	// The read service answers once it has subscribed: the stream's info for alice.
	alice, err := nats.Connect(srv.ClientURL(), nats.UserInfo("alice", "alice"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(alice.Close)
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, err := alice.Request(events.ReadAPIPrefix("alice")+".STREAM.INFO.TOOLBUS", nil, 2*time.Second)
		return err
	})
	cb, err := json.Marshal(map[string]string{"url": srv.ClientURL(),
		"alice_user": "alice", "alice_password": "alice", "bob_user": "bob", "bob_password": "bob",
		"alice_read_prefix": events.ReadAPIPrefix("alice"), "bob_read_prefix": events.ReadAPIPrefix("bob")})
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
	nodeTest(t, ctx, []string{"TOOLBUS_TEST_CLIENT_BUS=" + string(cb)}, node, "--test", "--test-concurrency=1",
		filepath.Join("dist", "test", "client-account.test.js"))
}
