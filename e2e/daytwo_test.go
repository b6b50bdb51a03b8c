package e2e_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// Day two: an administrator adds a team and grants a tool to another by running
// deploy/nats/gen again on the same directory. The deployment's keys are kept (the
// account is the same, so its streams and the audit trail stay visible), every
// credential whose permissions did not change is left as it was and keeps working
// without a restart, the changed team's new credentials carry the new grant, a removed
// team's files are gone and its JWT revoked. In operator mode nothing is done to the
// running server; users and nkeys need a config reload, which keeps every connection.
func TestDayTwoGrantsKeepTheDeployment(t *testing.T) {
	perms := filepath.Join("..", "deploy", "nats", "permissions.conf")
	day1 := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calculator"}}}
	day2 := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calculator", "big_output"}, "beta": {"noop"}}}
	for _, mode := range genModes() {
		t.Run(mode.name, func(t *testing.T) {
			dir := t.TempDir()
			gen := func(g natsjwt.Grants) natsjwt.Result {
				res, err := natsjwt.GenerateGrants(perms, dir, g, natsjwt.WithBcryptCost(bcrypt.MinCost))
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			res1 := gen(day1)
			file := mode.conf(res1)
			opts, err := server.ProcessConfigFile(file)
			if err != nil {
				t.Fatal(err)
			}
			srv := eventstest.StartServer(t, opts)
			ctx := eventstest.Context(t, 2*time.Minute)
			connectBus := func(user string, res natsjwt.Result) (*nats.Conn, *events.Bus, error) {
				nc, err := connectAs(t, srv.ClientURL(), user, nil, mode.opt(t, res, user))
				if err != nil {
					return nil, nil, err
				}
				b, err := events.Open(ctx, nc, events.Config{})
				return nc, b, err
			}
			adminNC, err := connectAs(t, srv.ClientURL(), "admin", nil, mode.opt(t, res1, "admin"))
			if err != nil {
				t.Fatal(err)
			}
			admin, _, err := provision.Setup(ctx, adminNC, events.Config{}, provision.WithTools([]string{"calculator", "big_output", "noop"}, 30*time.Second, 100))
			if err != nil {
				t.Fatal(err)
			}
			_, client, err := connectBus("client", res1)
			if err != nil {
				t.Fatal(err)
			}
			if err := client.StartRun(ctx, events.Source("cli", "t"), toolbus.RunStarted{RunID: "day-one", Principal: toolbus.Principal{ID: "carol"},
				Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "before the change"}}}); err != nil {
				t.Fatal(err)
			}
			_, alpha1, err := connectBus(natsjwt.TeamUser("alpha"), res1)
			if err != nil {
				t.Fatal(err)
			}
			before := map[string][]byte{}
			for _, u := range []string{"admin", "planner", "client", "executor"} {
				before[u] = readFile(t, res1.Creds[u])
			}

			// A JWT issued in a later second differs in its issue time and id: the
			// server refuses to reload a changed operator, so the second run must keep
			// the first's JWTs where nothing changed.
			time.Sleep(1100 * time.Millisecond)
			res2 := gen(day2)
			if mode.name == "jwt" {
				reloadConfigured(t, srv, mode.conf(res2), opts)
			}
			if res2.Operator != res1.Operator || res2.Account != res1.Account || res2.System != res1.System {
				t.Fatal("the second run made new operator or account keys")
			}
			want := map[string]string{"admin": "unchanged", "planner": "unchanged", "client": "unchanged",
				natsjwt.TeamUser("alpha"): "changed", natsjwt.TeamUser("beta"): "new"}
			for _, c := range res2.Changes {
				if w, ok := want[c.User]; ok && w != c.What {
					t.Errorf("%s: %s, want %s", c.User, c.What, w)
				}
			}
			for u, b := range before {
				if !bytes.Equal(b, readFile(t, res2.Creds[u])) {
					t.Errorf("%s's credentials were re-issued though its permissions did not change", u)
				}
			}
			if mode.name != "jwt" {
				reloadConfigured(t, srv, mode.conf(res2), opts)
			}

			// Everything opened on day one still works: the client and alpha's executor.
			if err := client.StartRun(ctx, events.Source("cli", "t"), toolbus.RunStarted{RunID: "day-two", Principal: toolbus.Principal{ID: "carol"},
				Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "after the change"}}}); err != nil {
				t.Fatalf("the client's day-one connection after the change: %v", err)
			}
			if err := alpha1.Store().PublishTool(ctx, toolbus.ToolContract{Name: "calculator", Description: "adds", Owner: "alpha",
				InputSchema: []byte(`{"type":"object"}`)}, false); err != nil {
				t.Fatalf("alpha's day-one connection after the change: %v", err)
			}
			// The new team works on its new credentials; alpha's new ones carry the grant.
			_, beta, err := connectBus(natsjwt.TeamUser("beta"), res2)
			if err != nil {
				t.Fatalf("beta's new credentials: %v", err)
			}
			if err := beta.Store().PublishTool(ctx, toolbus.ToolContract{Name: "noop", Description: "nothing", Owner: "beta",
				InputSchema: []byte(`{"type":"object"}`)}, false); err != nil {
				t.Fatalf("beta offers its tool: %v", err)
			}
			_, alpha2, err := connectBus(natsjwt.TeamUser("alpha"), res2)
			if err != nil {
				t.Fatal(err)
			}
			if err := alpha2.Store().PublishTool(ctx, toolbus.ToolContract{Name: "big_output", Description: "big", Owner: "alpha",
				InputSchema: []byte(`{"type":"object"}`)}, false); err != nil {
				t.Fatalf("alpha's new grant: %v", err)
			}
			// The audit trail of day one reads the same with the admin's credentials.
			_, admin2, err := connectBus("admin", res2)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range []*events.Bus{admin, admin2} {
				evs, err := b.RunEvents(ctx, "day-one")
				if err != nil || len(evs) == 0 {
					t.Fatalf("day one's run after the change: %d events, %v", len(evs), err)
				}
			}

			// Rotating one credential: alpha's old credentials stop working once the server
			// reloads; beta's files and connection are untouched.
			alpha := natsjwt.TeamUser("alpha")
			old := backup(t, res2, alpha)
			betaCreds := readFile(t, res2.Creds[natsjwt.TeamUser("beta")])
			res4, err := natsjwt.GenerateGrants(perms, dir, day2, natsjwt.WithBcryptCost(bcrypt.MinCost), natsjwt.WithRotate(alpha))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(res4.Changes, natsjwt.Change{User: alpha, What: "rotated"}) ||
				!bytes.Equal(betaCreds, readFile(t, res4.Creds[natsjwt.TeamUser("beta")])) {
				t.Fatalf("rotation of %s: %v (beta's credentials must stay)", alpha, res4.Changes)
			}
			reloadConfigured(t, srv, mode.conf(res4), opts)
			eventstest.Eventually(t, 30*time.Second, func() error {
				if _, err := connectAs(t, srv.ClientURL(), alpha, nil, mode.opt(t, old, alpha)); err == nil {
					return errors.New("alpha's rotated-out credentials still connect")
				}
				return nil
			})
			if _, _, err := connectBus(alpha, res4); err != nil {
				t.Fatalf("alpha's new credentials: %v", err)
			}
			if err := beta.Store().PublishTool(ctx, toolbus.ToolContract{Name: "noop", Description: "nothing", Owner: "beta",
				InputSchema: []byte(`{"type":"object"}`)}, false); err != nil {
				t.Fatalf("beta's connection after alpha's rotation: %v", err)
			}

			// Removing a team deletes its files and, in operator mode, revokes its JWT.
			res3 := gen(day1)
			if !slices.Contains(res3.Changes, natsjwt.Change{User: natsjwt.TeamUser("beta"), What: "removed"}) {
				t.Fatalf("beta not reported removed: %v", res3.Changes)
			}
			if _, err := os.Stat(filepath.Join(dir, natsjwt.TeamUser("beta")+".creds")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("beta's credentials are still there: %v", err)
			}
		})
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reloadConfigured reloads srv (started by eventstest.StartServer from opts) with the
// configuration file, as `nats-server --signal reload` does, keeping its address and
// store.
func reloadConfigured(t *testing.T, srv *server.Server, file string, started *server.Options) {
	t.Helper()
	o, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatal(err)
	}
	o.Host, o.Port = "127.0.0.1", srv.Addr().(*net.TCPAddr).Port
	o.HTTPHost, o.HTTPPort = started.HTTPHost, started.HTTPPort
	o.StoreDir, o.NoLog, o.NoSigs = started.StoreDir, true, true
	if err := srv.ReloadOptions(o); err != nil {
		t.Fatalf("reload: %v", err)
	}
}

// backup copies user's credential files of res aside and returns a Result naming the
// copies: the credentials as they were before a rotation.
func backup(t *testing.T, res natsjwt.Result, user string) natsjwt.Result {
	t.Helper()
	dir := t.TempDir()
	out := natsjwt.Result{Creds: map[string]string{}, Passwords: map[string]string{}, Seeds: map[string]string{}}
	for _, m := range []struct{ from, to map[string]string }{{res.Creds, out.Creds}, {res.Passwords, out.Passwords}, {res.Seeds, out.Seeds}} {
		p := filepath.Join(dir, filepath.Base(m.from[user]))
		if err := os.WriteFile(p, readFile(t, m.from[user]), 0o600); err != nil {
			t.Fatal(err)
		}
		m.to[user] = p
	}
	return out
}
