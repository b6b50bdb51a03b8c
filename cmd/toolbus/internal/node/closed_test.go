package node

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestRolesStopOnConnectionClosedForGood: a planner and an injector whose credentials
// are revoked while they run (their users removed by a configuration reload of a
// nats-server process, not in-process: a reload under running JetStream clients trips
// the race detector inside nats-server itself; the server drops them and refuses them
// on every reconnection, until nats.go gives up) stop, and RunRoles returns
// connect.ErrConnectionClosed with the server's reason, so the process exits non-zero
// saying why, instead of running on with nothing to run on. The control: a planner of
// a user that was not revoked goes on running.
func TestRolesStopOnConnectionClosedForGood(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "users.conf")
	users := func(names ...string) {
		t.Helper()
		var b strings.Builder
		for _, n := range names {
			fmt.Fprintf(&b, "{user: %q, password: %q}\n", n, n)
		}
		if err := os.WriteFile(conf, []byte(fmt.Sprintf("jetstream { store_dir: %q }\naccounts { A: { jetstream: enabled, users: [\n", filepath.Join(dir, "js"))+b.String()+"] } }\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	users("admin", "planner", "injector", "keeper")
	srv := testutil.StartNATS(t, conf)
	dial := func(user string) *nats.Conn {
		t.Helper()
		nc, err := nats.Connect(srv.URL, nats.UserInfo(user, user), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx := eventstest.Context(t, 2*time.Minute)
	cfg := events.Config{Memory: true, InstanceTTL: 2 * time.Second}
	if _, _, err := provision.Setup(ctx, dial("admin"), cfg); err != nil {
		t.Fatal(err)
	}
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	c.ReadService, c.WriteService = false, false
	run := func(user, role string) <-chan error {
		logs := &testutil.Buffer{}
		log := slog.New(slog.NewTextHandler(logs, nil))
		bus, err := events.Open(ctx, dial(user), cfg)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- RunRoles(ctx, c, bus, log, role) }()
		// Running once it serves (bound to its consumer, past every startup read, so that
		// the reload below finds it running, not starting).
		eventstest.Eventually(t, time.Minute, func() error {
			if !strings.Contains(logs.String(), " serving") {
				return fmt.Errorf("%s's %s not serving yet", user, role)
			}
			return nil
		})
		return done
	}
	planner, injector, keeper := run("planner", "planner"), run("injector", "injector"), run("keeper", "planner")

	users("admin", "keeper")
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	for role, done := range map[string]<-chan error{"planner": planner, "injector": injector} {
		select {
		case err := <-done:
			if !errors.Is(err, connect.ErrConnectionClosed) || !strings.Contains(err.Error(), "uthorization") {
				t.Errorf("the %s stopped with %v, want %v with the server's reason", role, err, connect.ErrConnectionClosed)
			}
		case <-time.After(time.Minute):
			t.Errorf("the %s still runs a minute after its credentials were revoked", role)
		}
	}
	select {
	case err := <-keeper:
		t.Errorf("the planner whose credentials stay stopped: %v", err)
	default:
	}
}
