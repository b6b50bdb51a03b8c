package e2e_test

// The half of the harness for servers started from the shipped deploy/nats files: the
// server, each role's credentials of each kind, connections that record permission
// violations, and stacks whose roles each use their own credentials.

import (
	"crypto/rand"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/planner"
)

var secRoles = []string{"planner", "executor", "injector", "client"}

// allRoles are secRoles plus the admin.
var allRoles = append([]string{"admin"}, secRoles...)

// startConfigured starts an embedded server from a deploy/nats config file on a random
// port of 127.0.0.1, with its store in a temp dir and no monitoring port; vars are the
// variables the file reads from the environment (confWith).
func startConfigured(t *testing.T, file string, vars map[string]string) *server.Server {
	t.Helper()
	if !filepath.IsAbs(file) {
		file = filepath.Join("..", "deploy", "nats", file)
	}
	if len(vars) > 0 {
		file = confWith(t, file, vars)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return eventstest.StartServer(t, opts)
}

// confWith copies the .conf files of file's folder into a folder of the test's, each
// $NAME of vars written as its value, and returns file's copy: the variables that
// nats-server reads from the environment, set without the process's environment
// (t.Setenv), so that the tests that give a server credentials of their own run in
// parallel.
func confWith(t *testing.T, file string, vars map[string]string) string {
	t.Helper()
	names := slices.Collect(maps.Keys(vars))
	slices.SortFunc(names, func(a, b string) int { return len(b) - len(a) }) // $NAME_X before $NAME
	files, err := filepath.Glob(filepath.Join(filepath.Dir(file), "*.conf"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		conf := string(b)
		for _, name := range names {
			conf = strings.ReplaceAll(conf, "$"+name, strconv.Quote(vars[name]))
		}
		writeFile(t, dir, filepath.Base(f), []byte(conf))
	}
	return filepath.Join(dir, filepath.Base(file))
}

// violations records the permission errors the server sends to each connection.
type violations struct {
	mu   sync.Mutex
	list []string
}

func (v *violations) add(s string) {
	v.mu.Lock()
	v.list = append(v.list, s)
	v.mu.Unlock()
}

func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.list)
}

func (v *violations) of(role string) []string {
	var out []string
	for _, s := range v.all() {
		if strings.HasPrefix(s, role+": ") {
			out = append(out, s)
		}
	}
	return out
}

// has reports whether role got a violation naming subject.
func (v *violations) has(role, subject string) bool {
	for _, s := range v.of(role) {
		if strings.Contains(s, `"`+subject+`"`) {
			return true
		}
	}
	return false
}

// connectAs connects as role with opts, recording permission violations.
func connectAs(t *testing.T, url, role string, v *violations, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	opts = append([]nats.Option{
		nats.Name("toolbus " + role), nats.Timeout(2 * time.Second), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if v != nil && strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				v.add(role + ": " + err.Error())
			}
		}),
	}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// secured is a stack whose roles each connect with their own credentials: the admin,
// which set the bus up, and secRoles.
type secured struct{ *stack }

func secModel() planner.Model {
	return &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "calculator", `{"expression":"2+3"}`)),
		planner.Answer("done"),
	}}
}

// startSecured connects the admin, which sets the bus up as `toolbus init` does, then
// every role with its own options, which only binds (events.Open), and starts the
// planner, executor and injector; the client connection submits runs.
func startSecured(t *testing.T, url string, opts map[string][]nats.Option) *secured {
	t.Helper()
	return startSecuredWith(t, url, opts, secModel())
}

// startSecuredExec is startSecuredWith with options for the executor (an authorizer)
// and the injector's decision policy (injector.Config.Deciders).
func startSecuredExec(t *testing.T, url string, opts map[string][]nats.Option, model planner.Model, execOpts []executor.Option, deciders []string, extra ...executor.Tool) *secured {
	t.Helper()
	s := newSecuredStack(t, url, opts, secRoles, model, extra...)
	s.deciders = deciders
	s.startExecutor("sec-executor", worker.Config{}, execOpts...)
	s.startPlanner("sec-planner")
	s.startInjector("sec-injector")
	return &secured{s}
}

// startSecuredWith is startSecured with another model and extra tools for the executor.
func startSecuredWith(t *testing.T, url string, opts map[string][]nats.Option, model planner.Model, extra ...executor.Tool) *secured {
	t.Helper()
	s := newSecuredStack(t, url, opts, secRoles, model, extra...)
	s.startExecutor("sec-executor", worker.Config{})
	s.startPlanner("sec-planner")
	s.startInjector("sec-injector")
	return &secured{s}
}

// newSecuredStack is a stack on the server at url, started from the shipped deploy/nats
// files: the admin connects and sets the bus up as `toolbus init --tools <the
// registry's tools>` does, then each of users connects with its own options and only
// binds (events.Open). No role is started.
func newSecuredStack(t *testing.T, url string, opts map[string][]nats.Option, users []string, model planner.Model, extra ...executor.Tool) *stack {
	t.Helper()
	return newSecuredStackConfig(t, url, events.Config{}, opts, users, model, extra...)
}

// newSecuredStackConfig is newSecuredStack with the bus configuration cfg, for the
// admin's setup and every user's bus alike.
func newSecuredStackConfig(t *testing.T, url string, cfg events.Config, opts map[string][]nats.Option, users []string, model planner.Model, extra ...executor.Tool) *stack {
	t.Helper()
	s := newStackBare(t, eventstest.Context(t, 4*time.Minute), model, extra...)
	s.url, s.opts, s.viol = url, opts, &violations{}
	s.conns, s.buses = map[string]*nats.Conn{}, map[string]*events.Bus{}
	admin, err := connectAs(t, url, "admin", s.viol, opts["admin"]...)
	if err != nil {
		t.Fatalf("admin connects: %v", err)
	}
	adminBus, changes, err := provision.Setup(s.ctx, admin, cfg,
		provision.WithTools(s.reg.Names(), 30*time.Second, 1000), provision.WithReadMirror())
	if err != nil {
		t.Fatalf("admin sets the bus up: %v", err)
	}
	t.Logf("setup: %v", changes)
	s.bus, s.conns["admin"], s.buses["admin"] = adminBus, admin, adminBus
	for _, u := range users {
		nc, err := connectAs(t, url, u, s.viol, opts[u]...)
		if err != nil {
			t.Fatalf("%s connects: %v", u, err)
		}
		bus, err := events.Open(s.ctx, nc, cfg)
		if err != nil {
			t.Fatalf("%s opens the bus: %v", u, err)
		}
		s.conns[u], s.buses[u] = nc, bus
	}
	return s
}

// shutdown stops every role and waits for them.
func (s *secured) shutdown() { s.stopAll() }

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// newPasswords makes a password per role, and the variables auth-users.conf reads them
// from (startConfigured).
func newPasswords() (pw, vars map[string]string) {
	pw, vars = map[string]string{}, map[string]string{}
	for _, role := range allRoles {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		pw[role] = fmt.Sprintf("%x", b)
		vars["TOOLBUS_"+strings.ToUpper(role)+"_PASSWORD"] = pw[role]
	}
	return pw, vars
}

// credentialKind starts a server from a deploy/nats config with one credential per role
// of one kind, and returns its URL and each role's connect options.
type credentialKind struct {
	name  string
	start func(t *testing.T) (url string, opts map[string][]nats.Option)
}

// credentialKinds are the ways deploy/nats gives credentials: user/password
// (auth-users.conf), nkeys (auth-nkeys.conf) and JWTs (go run ./deploy/nats/gen), all
// with the role permissions of permissions.conf.
func credentialKinds() []credentialKind {
	return []credentialKind{
		{"user-password", func(t *testing.T) (string, map[string][]nats.Option) {
			pw, vars := newPasswords()
			srv := startConfigured(t, "auth-users.conf", vars)
			opts := map[string][]nats.Option{}
			for _, role := range allRoles {
				opts[role] = []nats.Option{nats.UserInfo(role, pw[role])}
			}
			return srv.ClientURL(), opts
		}},
		{"nkeys", func(t *testing.T) (string, map[string][]nats.Option) {
			dir := t.TempDir()
			opts, vars := map[string][]nats.Option{}, map[string]string{}
			for _, role := range allRoles {
				kp, err := nkeys.CreateUser()
				if err != nil {
					t.Fatal(err)
				}
				pub, _ := kp.PublicKey()
				seed, _ := kp.Seed()
				vars["TOOLBUS_"+strings.ToUpper(role)+"_NKEY"] = pub
				o, err := nats.NkeyOptionFromSeed(writeFile(t, dir, role+".nk", seed))
				if err != nil {
					t.Fatal(err)
				}
				opts[role] = []nats.Option{o}
			}
			srv := startConfigured(t, "auth-nkeys.conf", vars)
			return srv.ClientURL(), opts
		}},
		{"jwt", func(t *testing.T) (string, map[string][]nats.Option) {
			// The JWT setup needs no password, but the generator hashes one per user too:
			// at the lowest cost, which a race-instrumented test pays quickly.
			res, err := natsjwt.GenerateGrants(filepath.Join("..", "deploy", "nats", "permissions.conf"), t.TempDir(), natsjwt.Grants{},
				natsjwt.WithBcryptCost(bcrypt.MinCost))
			if err != nil {
				t.Fatal(err)
			}
			srv := startConfigured(t, res.Config, nil)
			opts := map[string][]nats.Option{}
			for _, role := range allRoles {
				opts[role] = []nats.Option{nats.UserCredentials(res.Creds[role])}
			}
			return srv.ClientURL(), opts
		}},
	}
}
