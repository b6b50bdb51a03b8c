package typescript_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// TestNPMPermissionDenied runs the package's test of the permission_denied answer
// (test/perms.test.ts): its executor connects as a user that may not publish to the
// outputs bucket ($KV.toolbus_outputs.>), on a server with toolbus's stream and buckets
// set up by a user with every permission.
func TestNPMPermissionDenied(t *testing.T) {
	npm := needNPM(t)
	srv := eventstest.StartServer(t, &server.Options{JetStream: true, Users: []*server.User{
		{Username: "core", Password: "core"},
		{Username: "exec", Password: "exec", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$KV.toolbus_outputs.>"}}}},
	}})
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("core", "core"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, _, err := provision.Setup(ctx, nc, events.Config{}); err != nil {
		t.Fatal(err)
	}
	pb, err := json.Marshal(map[string]string{"url": srv.ClientURL(), "core_user": "core", "core_password": "core",
		"exec_user": "exec", "exec_password": "exec"})
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
	nodeTest(t, ctx, []string{"TOOLBUS_TEST_PERMS_BUS=" + string(pb)}, node, "--test", filepath.Join("dist", "test", "perms.test.js"))
}
