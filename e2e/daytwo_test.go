package e2e_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/internal/testutil"
)

// Day two: an administrator adds a team and grants a tool to another by running
// deploy/nats/gen again on the same directory. The deployment's keys are kept (the
// account is the same, so its streams and the audit trail stay visible), every
// credential whose permissions did not change is left as it was and keeps working
// without a restart, the changed team's new credentials carry the new grant, a removed
// team's files are gone and its JWT revoked. In operator mode nothing is done to the
// running server; users and nkeys need a config reload, which keeps every connection.
func TestDayTwoGrantsKeepTheDeployment(t *testing.T) {
	t.Parallel()
	perms := filepath.Join("..", "deploy", "nats", "permissions.conf")
	day1 := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calculator"}}}
	day2 := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calculator", "big_output"}, "beta": {"noop"}}}
	bin := buildToolbus(t)
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
			srv := startServerProcess(t, bin, mode.conf(res1))
			ctx := eventstest.Context(t, 2*time.Minute)
			connectBus := func(user string, res natsjwt.Result) (*nats.Conn, *events.Bus, error) {
				nc, err := connectAs(t, srv.url, user, nil, mode.opt(t, res, user))
				if err != nil {
					return nil, nil, err
				}
				b, err := events.Open(ctx, nc, events.Config{})
				return nc, b, err
			}
			adminNC, err := connectAs(t, srv.url, "admin", nil, mode.opt(t, res1, "admin"))
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
				srv.reload(t)
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
				srv.reload(t)
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
				evs, err := runlog.Events(ctx, b, "day-one")
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
			srv.reload(t)
			eventstest.Eventually(t, 30*time.Second, func() error {
				if _, err := connectAs(t, srv.url, alpha, nil, mode.opt(t, old, alpha)); err == nil {
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

// serverProcess is a `toolbus server` process, as docs/deployment-and-security.md runs
// one: a separate process whose configuration a SIGHUP reloads. (An in-process server
// reloaded while clients use it trips the race detector inside nats-server itself, in
// code no deployment runs under -race.)
type serverProcess struct {
	url     string
	cmd     *exec.Cmd
	log     *testutil.Buffer
	reloads int
}

// startServerProcess runs `toolbus server -c config` with a store of its own on a free
// loopback port, until the test ends.
func startServerProcess(t *testing.T, bin, config string) *serverProcess {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	p := &serverProcess{url: "nats://127.0.0.1:" + port, log: &testutil.Buffer{}}
	p.cmd = exec.Command(bin, "server", "-c", config, "-sd", t.TempDir(), "-a", "127.0.0.1", "-p", port, "-m", "0")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("toolbus server's log:\n%s", p.log)
		}
	})
	eventstest.Eventually(t, time.Minute, func() error {
		if !strings.Contains(p.log.String(), "Server is ready") {
			return errors.New("toolbus server not ready")
		}
		return nil
	})
	return p
}

// reload sends SIGHUP, as `kill -HUP` of the docs does, and waits for the server to log
// that it loaded the file again.
func (p *serverProcess) reload(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.reloads++
	eventstest.Eventually(t, time.Minute, func() error {
		log := p.log.String()
		if strings.Contains(log, "configuration not reloaded") {
			t.Fatalf("the server refused the new configuration:\n%s", log)
		}
		if strings.Count(log, "reloaded") < p.reloads {
			return errors.New("configuration not reloaded yet")
		}
		return nil
	})
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
