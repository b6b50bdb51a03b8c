package conformance_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/conformance"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/testutil"
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
	requireOK(t, run(t, conformance.Config{
		Command: goExecutor(t), Tool: "sleep",
		Env: []string{"TOOLBUS_TOOLS=diag", "TOOLBUS_EXECUTOR_TOOLS=sleep", "TOOLBUS_LOG_LEVEL=warn"},
	}))
}

// nodeExecutor returns the command of examples/node-executor, a program on the
// TypeScript package sdk/typescript (@toolbus/sdk). Without Node, the example's packages
// or the package's build (dist/, made by its npm ci) the test is skipped on a developer
// machine and fails under CI (CI set), where make test installs and builds them.
func nodeExecutor(t *testing.T) []string {
	t.Helper()
	const dir = "../examples/node-executor"
	// The package's build (dist/) is made by sdk/typescript's npm ci, which make npm runs first.
	testutil.NeedNPMPackage(t, dir, "node_modules/@toolbus/sdk/dist/src/index.js")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
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
		{"ignore_live_claims", "the call ran while the executor that claimed it was alive"},
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

// The TypeScript package's executor on a team's own credentials, for each credential
// kind deploy/nats/gen issues: an administrator grants team alpha the tool delay and
// creates its queue; the executor (TOOLBUS_TEAM=alpha) may then write only alpha's
// catalog entry, instance records, claims, outputs and results, and still keeps every
// rule of the suite.
func TestNodeExecutorTeamCredentials(t *testing.T) {
	cmd := nodeExecutor(t)
	perms := filepath.Join("..", "deploy", "nats", "permissions.conf")
	grants := natsjwt.Grants{Teams: map[string][]string{"alpha": {"delay"}}}
	team := natsjwt.TeamUser("alpha")
	modes := []struct {
		name  string
		conf  func(natsjwt.Result) string
		admin func(natsjwt.Result) nats.Option
		env   func(natsjwt.Result) []string
	}{
		{"user-password", func(r natsjwt.Result) string { return r.UsersConfig },
			func(r natsjwt.Result) nats.Option { return nats.UserInfo("admin", readFile(t, r.Passwords["admin"])) },
			func(r natsjwt.Result) []string {
				return []string{"TOOLBUS_NATS_USER=" + team, "TOOLBUS_NATS_PASSWORD=" + readFile(t, r.Passwords[team])}
			}},
		{"nkeys", func(r natsjwt.Result) string { return r.NkeysConfig },
			func(r natsjwt.Result) nats.Option {
				o, err := nats.NkeyOptionFromSeed(r.Seeds["admin"])
				if err != nil {
					t.Fatal(err)
				}
				return o
			},
			func(r natsjwt.Result) []string { return []string{"TOOLBUS_NATS_NKEY=" + r.Seeds[team]} }},
		{"jwt", func(r natsjwt.Result) string { return r.Config },
			func(r natsjwt.Result) nats.Option { return nats.UserCredentials(r.Creds["admin"]) },
			func(r natsjwt.Result) []string { return []string{"TOOLBUS_NATS_CREDS=" + r.Creds[team]} }},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			res, err := natsjwt.GenerateGrants(perms, t.TempDir(), grants, natsjwt.WithBcryptCost(bcrypt.MinCost))
			if err != nil {
				t.Fatal(err)
			}
			opts, err := server.ProcessConfigFile(mode.conf(res))
			if err != nil {
				t.Fatal(err)
			}
			srv := eventstest.StartServer(t, opts)
			nc, err := nats.Connect(srv.ClientURL(), mode.admin(res))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			// The admin's part: the stream, the buckets and the team's queue.
			ctx := eventstest.Context(t, time.Minute)
			if _, _, err := provision.Setup(ctx, nc, events.Config{}, provision.WithTools([]string{"delay"}, workerconfig.QueueAckWait(2*time.Second, 0), 1000)); err != nil {
				t.Fatal(err)
			}
			rep, err := conformance.Check(context.Background(), nc, srv.ClientURL(), conformance.Config{Command: cmd, Tool: "delay",
				Env: append(mode.env(res), "TOOLBUS_TEAM=alpha")})
			if err != nil {
				t.Fatalf("%v\n---- executor ----\n%s", err, rep.Log)
			}
			requireOK(t, rep)
			// The catalog records the team as the tool's owner.
			bus, err := events.Open(ctx, nc, events.Config{})
			if err != nil {
				t.Fatal(err)
			}
			cs, err := bus.Store().Contracts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if c.Name == "delay" && c.Owner != "alpha" {
					t.Errorf("delay's owner in the catalog is %q, want alpha", c.Owner)
				}
			}
		})
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goBuild builds the toolbus binary (with -race) once for the package's tests.
var goBuild struct {
	once sync.Once
	bin  string
	err  error
}

// goExecutor returns the command of the built-in Go executor (`toolbus executor`).
func goExecutor(t *testing.T) []string {
	t.Helper()
	goBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "toolbus-conformance-")
		if err != nil {
			goBuild.err = err
			return
		}
		goBuild.bin = filepath.Join(dir, "toolbus")
		if out, err := exec.Command("go", "build", "-race", "-o", goBuild.bin, "../cmd/toolbus").CombinedOutput(); err != nil {
			goBuild.err = fmt.Errorf("build toolbus: %w\n%s", err, out)
		}
	})
	if goBuild.err != nil {
		t.Fatal(goBuild.err)
	}
	return []string{goBuild.bin, "executor"}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if goBuild.bin != "" {
		_ = os.RemoveAll(filepath.Dir(goBuild.bin))
	}
	os.Exit(code)
}

// The TypeScript package's executor (examples/node-executor, serving delay) in a team's
// own account, for each credential kind: checkTeamAccounts.
func TestNodeExecutorTeamAccounts(t *testing.T) {
	checkTeamAccounts(t, nodeExecutor(t), "delay", nil)
}

// The Go executor (`toolbus executor`, serving the diag pack's sleep) in a team's own
// account, for each credential kind: checkTeamAccounts.
func TestGoExecutorTeamAccounts(t *testing.T) {
	checkTeamAccounts(t, goExecutor(t), "sleep", []string{"TOOLBUS_TOOLS=diag", "TOOLBUS_LOG_LEVEL=warn"})
}

// checkTeamAccounts runs the suite on an executor in a team's own account (the accounts
// layout of deploy/nats/gen -accounts), for each credential kind it issues: team alpha
// is granted the tool, the core's admin creates its queue, and the executor runs with
// alpha's credentials and the settings the generator names for them (TOOLBUS_TEAM,
// TOOLBUS_EXECUTOR_TOOLS, TOOLBUS_NATS_API_PREFIX=JS.core.API). It reaches the core only
// through what the core exports to alpha, and keeps every rule of the suite in its
// team-account form (conformance.Config.Accounts: the end of a run reaches it as the
// core's run-ended notice; a squatted result id does not apply).
func checkTeamAccounts(t *testing.T, cmd []string, tool string, extraEnv []string) {
	perms := filepath.Join("..", "deploy", "nats", "permissions.conf")
	team := natsjwt.TeamUser("alpha")
	kinds := []struct {
		name  string
		conf  func(natsjwt.Result) string
		login func(r natsjwt.Result, user string) nats.Option
		env   func(r natsjwt.Result, user string) []string
	}{
		{"jwt", func(r natsjwt.Result) string { return r.Config },
			func(r natsjwt.Result, u string) nats.Option { return nats.UserCredentials(r.Creds[u]) },
			func(r natsjwt.Result, u string) []string { return []string{"TOOLBUS_NATS_CREDS=" + r.Creds[u]} }},
		{"user-password", func(r natsjwt.Result) string { return r.UsersConfig },
			func(r natsjwt.Result, u string) nats.Option { return nats.UserInfo(u, readFile(t, r.Passwords[u])) },
			func(r natsjwt.Result, u string) []string {
				return []string{"TOOLBUS_NATS_USER=" + u, "TOOLBUS_NATS_PASSWORD=" + readFile(t, r.Passwords[u])}
			}},
		{"nkeys", func(r natsjwt.Result) string { return r.NkeysConfig },
			func(r natsjwt.Result, u string) nats.Option {
				o, err := nats.NkeyOptionFromSeed(r.Seeds[u])
				if err != nil {
					t.Fatal(err)
				}
				return o
			},
			func(r natsjwt.Result, u string) []string { return []string{"TOOLBUS_NATS_NKEY=" + r.Seeds[u]} }},
	}
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			dir := t.TempDir()
			res, err := natsjwt.GenerateGrants(perms, dir, natsjwt.Grants{Teams: map[string][]string{"alpha": {tool}}},
				natsjwt.WithAccounts(), natsjwt.WithBcryptCost(bcrypt.MinCost))
			if err != nil {
				t.Fatal(err)
			}
			settings := res.Env[team]
			if !slices.Contains(settings, "TOOLBUS_NATS_API_PREFIX="+natsjwt.CoreAPIPrefix) {
				t.Fatalf("the generated settings of %s lack TOOLBUS_NATS_API_PREFIX=%s: %v", team, natsjwt.CoreAPIPrefix, settings)
			}
			opts, err := server.ProcessConfigFile(kind.conf(res))
			if err != nil {
				t.Fatal(err)
			}
			srv := eventstest.StartServer(t, opts)
			nc, err := nats.Connect(srv.ClientURL(), kind.login(res, "admin"))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			// The core admin's part: the stream, the buckets and the team's queue.
			ctx := eventstest.Context(t, time.Minute)
			if _, _, err := provision.Setup(ctx, nc, events.Config{}, provision.WithTools([]string{tool}, workerconfig.QueueAckWait(2*time.Second, 0), 1000)); err != nil {
				t.Fatal(err)
			}
			// The core's write service (every injector runs it), with the generated
			// injector's credentials: the team's writes reach the core through it.
			inj, err := nats.Connect(srv.ClientURL(), kind.login(res, "injector"))
			if err != nil {
				t.Fatal(err)
			}
			defer inj.Close()
			intaketest.ServeIntake(t, inj, intake.Limits{})
			env := append(append(append([]string{}, extraEnv...), kind.env(res, team)...), settings...)
			rep, err := conformance.Check(context.Background(), nc, srv.ClientURL(), conformance.Config{Command: cmd, Tool: tool,
				Env: env, Team: "alpha", Accounts: true})
			if err != nil {
				t.Fatalf("%v\n---- executor ----\n%s", err, rep.Log)
			}
			requireOK(t, rep)
			if kind.name == "jwt" {
				checkRevokedCredentials(t, srv, cmd, env, perms, dir, res, tool)
			}
		})
	}
}

// checkRevokedCredentials runs the executor with team alpha's .creds (operator mode),
// then changes them as toolbus admin does, pushing alpha's account JWT to the running
// server: a rotation (the file rewritten, the old key revoked) cuts the executor's
// connection, and it reconnects with the rewritten file, serving again; a removal (the
// key revoked, no new file) leaves it nothing to connect with, and it exits non-zero
// saying why (its /healthz fails in between). The Go and the TypeScript executor do the
// same.
func checkRevokedCredentials(t *testing.T, srv *server.Server, cmd, env []string, perms, dir string, res natsjwt.Result, tool string) {
	t.Helper()
	team := natsjwt.TeamUser("alpha")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	ex := exec.Command(cmd[0], cmd[1:]...)
	var out testutil.Buffer
	ex.Env = append(append(os.Environ(), env...), "TOOLBUS_NATS_URL="+srv.ClientURL(), "TOOLBUS_METRICS_ADDR=127.0.0.1:"+fmt.Sprint(port),
		"TOOLBUS_INSTANCE=revoked-1")
	ex.Stdout, ex.Stderr = &out, &out
	if err := ex.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- ex.Wait() }()
	t.Cleanup(func() {
		_ = ex.Process.Kill()
		if t.Failed() {
			t.Logf("---- executor ----\n%s", out.String())
		}
	})
	get := func(path string) int {
		r, err := http.Get("http://127.0.0.1:" + fmt.Sprint(port) + path)
		if err != nil {
			return 0
		}
		_ = r.Body.Close()
		return r.StatusCode
	}
	// connectedAs is the user key of the executor's connection ("" while it has none).
	connectedAs := func() string {
		cz, err := srv.Connz(&server.ConnzOptions{Username: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cz.Conns {
			if strings.Contains(c.Name, "revoked-1") {
				return c.AuthorizedUser
			}
		}
		return ""
	}
	eventstest.Eventually(t, time.Minute, func() error {
		if code := get("/readyz"); code != 200 {
			return fmt.Errorf("/readyz %d", code)
		}
		return nil
	})
	before := connectedAs()
	push := func(g natsjwt.Grants, rotate ...string) natsjwt.Result {
		t.Helper()
		r, err := natsjwt.GenerateGrants(perms, dir, g, natsjwt.WithAccounts(), natsjwt.WithBcryptCost(bcrypt.MinCost), natsjwt.WithRotate(rotate...))
		if err != nil {
			t.Fatal(err)
		}
		sys, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(r.SystemCreds))
		if err != nil {
			t.Fatal(err)
		}
		defer sys.Close()
		ctx := eventstest.Context(t, 30*time.Second)
		pub := r.TeamAccounts["alpha"]
		if err := natsjwt.PushAccounts(ctx, sys, map[string]string{pub: r.AccountJWTs[pub]}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	push(natsjwt.Grants{Teams: map[string][]string{"alpha": {tool}}}, team)
	eventstest.Eventually(t, time.Minute, func() error {
		if now := connectedAs(); now == "" || now == before {
			return fmt.Errorf("connected as %q (before the rotation %q)", now, before)
		}
		if code := get("/readyz"); code != 200 {
			return fmt.Errorf("/readyz %d after the rotation", code)
		}
		return nil
	})
	select {
	case err := <-exited:
		t.Fatalf("the executor exited on a rotated credential: %v", err)
	default:
	}
	// Removed: its key revoked, no file to take instead.
	push(natsjwt.Grants{Teams: map[string][]string{}})
	deadline := time.After(time.Minute)
	for {
		select {
		case err := <-exited:
			if err == nil {
				t.Fatalf("the executor exited 0 when its credentials were revoked")
			}
			if !strings.Contains(out.String(), "closed for good") {
				t.Errorf("the executor does not say why it exited")
			}
			return
		case <-deadline:
			t.Fatalf("the executor still runs a minute after its credentials were revoked (/healthz %d)", get("/healthz"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}
