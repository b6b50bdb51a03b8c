package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"

	natsconf "github.com/toolbus/toolbus/deploy/nats"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/intake"
)

// The files toolbus admin keeps in a deployment's directory besides what
// natsjwt.GenerateGrants writes there.
const (
	// GrantsFile is the deployment's grants (natsjwt.Grants as JSON).
	GrantsFile = "grants.json"
	// SettingsFile is how init issued the deployment (Settings as JSON): every later
	// command issues the same way, so the configs change only where the grants do.
	SettingsFile = "deployment.json"
	// PermsDir holds the permissions the credentials are issued from, copied at init
	// from the binary (package natsconf): a newer binary issues the same until the
	// administrator replaces them.
	PermsDir = "permissions"
)

// Settings are what admin init was told.
type Settings struct {
	Accounts bool   `json:"accounts"`
	Listen   string `json:"listen"`
	Store    string `json:"store,omitempty"`
	// ResolverDir is the directory of auth-jwt.conf's full resolver (the accounts
	// layout; natsjwt.WithFullResolver), which takes a new or changed account from a
	// push. "": a memory resolver (init -memory-resolver, -one-account, or a deployment
	// init made before the full resolver, which keeps its memory resolver).
	ResolverDir string `json:"resolver_dir,omitempty"`
	// TenantLimits caps each team's and client's account in the accounts layout
	// (init -tenant-conns, -tenant-subs, -tenant-leafnodes; natsjwt.WithTenantLimits):
	// a field left out is accounts.DefaultTenantLimits' value.
	TenantLimits accounts.TenantLimits `json:"tenant_limits,omitzero"`
	// NoCoreWide leaves out the core account's shared executor and client users
	// (natsjwt.CoreWide, natsjwt.WithoutCoreWide): the accounts layout's init sets it
	// unless asked for them (-core-wide). A deployment init made before has them.
	NoCoreWide bool `json:"no_core_wide,omitempty"`
	// Auth are the kinds of credentials issued (init -auth; natsjwt.WithKinds): one
	// secret file per user and kind. None: every kind (a deployment init made before).
	Auth []string `json:"auth,omitempty"`
}

// users are the users the deployment issues for g (natsjwt.Users without the CoreWide
// ones when s.NoCoreWide).
func (s Settings) users(g natsjwt.Grants) []natsjwt.User {
	users := natsjwt.Users(nil, g)
	if s.Accounts && s.NoCoreWide {
		users = slices.DeleteFunc(users, func(u natsjwt.User) bool {
			return u.Team == "" && u.Client == "" && slices.Contains(natsjwt.CoreWide, u.Name)
		})
	}
	return users
}

// ResolverSubdir is the full resolver's directory under -store, or under the
// deployment's directory, unless init is told one (-resolver-dir).
const ResolverSubdir = "resolver"

// defaultResolverDir is where init puts the full resolver's directory unless told: beside
// the JetStream store (-store: the server's state in one place, as the NATS Helm chart
// keeps it), else in the deployment's directory dir, as an absolute path.
func defaultResolverDir(dir string, s Settings) (string, error) {
	if s.Store != "" {
		return filepath.Join(s.Store, ResolverSubdir), nil
	}
	abs, err := filepath.Abs(filepath.Join(dir, ResolverSubdir))
	if err != nil {
		return "", fmt.Errorf("admin: %w", err)
	}
	return abs, nil
}

// bcryptCost is the cost of the password hashes (the tests lower it).
var bcryptCost = bcrypt.DefaultCost

func (s Settings) options(rotate ...string) []natsjwt.Option {
	opts := []natsjwt.Option{natsjwt.WithListen(s.Listen), natsjwt.WithStoreDir(s.Store), natsjwt.WithBcryptCost(bcryptCost), natsjwt.WithRotate(rotate...), natsjwt.WithTenantLimits(s.TenantLimits)}
	if s.Accounts {
		opts = append(opts, natsjwt.WithAccounts())
	}
	if s.ResolverDir != "" {
		opts = append(opts, natsjwt.WithFullResolver(s.ResolverDir))
	}
	if s.NoCoreWide {
		opts = append(opts, natsjwt.WithoutCoreWide())
	}
	if len(s.Auth) > 0 {
		opts = append(opts, natsjwt.WithKinds(s.Auth...))
	}
	return opts
}

// Init creates a deployment in dir: its keys, every role's credentials, the server
// configs, the permissions and an empty grants file. A directory that holds a
// deployment (its grants, settings or operator key) is refused: its keys are never
// made again.
func Init(dir string, s Settings, stdout io.Writer) error {
	for _, f := range []string{GrantsFile, SettingsFile, "operator.nk"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return refused("%s holds a deployment already (%s): init makes one once; change it with toolbus admin add-team, grant, revoke...", dir, f)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, PermsDir), 0o700); err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	for _, name := range natsconf.Names {
		b, err := natsconf.Files.ReadFile(name)
		if err != nil {
			return fmt.Errorf("admin: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, PermsDir, name), b, 0o600); err != nil {
			return fmt.Errorf("admin: %w", err)
		}
	}
	g := natsjwt.Grants{Teams: map[string][]string{}}
	res, err := natsjwt.GenerateGrants(filepath.Join(dir, PermsDir, "permissions.conf"), dir, g, s.options()...)
	if err != nil {
		return err
	}
	if err := issueSigningKeys(dir, s.users(g), g, nil, time.Now()); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, SettingsFile), s); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, GrantsFile), g); err != nil {
		return err
	}
	layout := "one account for everyone (-one-account)"
	if s.Accounts {
		layout = "the accounts layout: a core account, and one account per team and per client"
	}
	fmt.Fprintf(stdout, "created a deployment in %s (secrets: keep it out of git), %s\n", dir, layout)
	if s.Accounts {
		// The bound is the injectors' (their write service), on by default: say so here,
		// where the teams and clients are made, so that nobody takes writes for unbounded.
		fmt.Fprintf(stdout, "each team's and client identity's writes are bounded by every injector's write service: TOOLBUS_TENANT_BYTES_PER_SECOND (default %d, subject and headers counted; 0 lifts it) with a burst of a minute of it (TOOLBUS_TENANT_BYTES_BURST)\n", intake.DefaultBytesPerSecond)
	}
	fmt.Fprintln(stdout, "server configs:", strings.Join(slices.DeleteFunc([]string{res.Config, res.UsersConfig, res.NkeysConfig}, func(f string) bool { return f == "" }), " "))
	if s.ResolverDir != "" {
		fmt.Fprintf(stdout, "%s has a full resolver: the server stores the account JWTs in %s (it must be able to write it; the configs can stay read-only) and takes new and changed accounts from -push, with no reload\n", filepath.Base(res.Config), s.ResolverDir)
	}
	if s.Store == "" {
		fmt.Fprintf(stdout, "run a server: toolbus server -c %s -sd DIR\n", res.Config)
	} else {
		fmt.Fprintf(stdout, "run a server: toolbus server -c %s\n", res.Config)
	}
	for _, u := range s.users(g) {
		natsjwt.WriteUser(stdout, res, u.Name)
		if note := natsjwt.CoreWideNote(u.Name); note != "" && s.Accounts {
			fmt.Fprintf(stdout, "%-20s %s\n", "", note)
		}
	}
	if s.Accounts && s.NoCoreWide {
		fmt.Fprintln(stdout, "no core-wide executor or client credentials: each team's executors get executor-<team> (toolbus admin add-team TEAM TOOL...), each client and front door (toolbus mcp, the console) client-<name> bound to the identities it serves (toolbus admin add-client NAME IDENTITY...); init -core-wide issues the core's executor and client for a deployment whose teams trust each other")
	}
	fmt.Fprintln(stdout, "hand each process its user's file (TOOLBUS_NATS_CREDS); toolbus init runs with admin's")
	fmt.Fprintf(stdout, "each user's signing key is <user>.sign beside its credentials (TOOLBUS_SIGNING_KEY); publish the public halves (%s) with toolbus admin publish-keys once the server runs\n", KeyringFile)
	return nil
}

// deployment is a directory init made.
type deployment struct {
	dir      string
	settings Settings
	grants   natsjwt.Grants
}

func open(dir string) (*deployment, error) {
	d := &deployment{dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, SettingsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, refused("%s holds no deployment of toolbus admin (no %s): create one with toolbus admin init -dir %s", dir, SettingsFile, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	if err := json.Unmarshal(b, &d.settings); err != nil {
		return nil, fmt.Errorf("admin: %s: %w", SettingsFile, err)
	}
	if d.grants, err = natsjwt.ReadGrants(filepath.Join(dir, GrantsFile)); err != nil {
		return nil, err
	}
	return d, nil
}

// issue issues the deployment's credentials for g with the same keys, then keeps g.
func (d *deployment) issue(g natsjwt.Grants, rotate ...string) (natsjwt.Result, error) {
	if err := g.Validate(); err != nil {
		return natsjwt.Result{}, refused("%v", err)
	}
	res, err := natsjwt.GenerateGrants(filepath.Join(d.dir, PermsDir, "permissions.conf"), d.dir, g, d.settings.options(rotate...)...)
	if err != nil {
		return res, err
	}
	if err := issueSigningKeys(d.dir, d.settings.users(g), g, rotate, time.Now()); err != nil {
		return res, err
	}
	d.grants = g
	return res, writeJSON(filepath.Join(d.dir, GrantsFile), g)
}

// pushed is the outcome of a push: the accounts the servers took, those they had not
// loaded (a new account with a memory resolver: a reload loads it).
type pushed struct {
	took, skipped map[string]bool // by Change.User ("account team-alpha")
}

// push sends the account JWTs of changes (all of them with every) to the server at url
// with the deployment's system user, one account at a time.
func (d *deployment) push(ctx context.Context, url string, res natsjwt.Result, every bool) (pushed, error) {
	p := pushed{took: map[string]bool{}, skipped: map[string]bool{}}
	if res.SystemCreds == "" {
		return p, refused("-push needs the system user (system.creds), which only the accounts layout issues: reload the server instead (kill -HUP)")
	}
	if url == "" {
		return p, refused("-push needs the server: set TOOLBUS_NATS_URL or give -server URL")
	}
	nc, err := nats.Connect(url, nats.UserCredentials(res.SystemCreds), nats.Name("toolbus admin"))
	if err != nil {
		return p, fmt.Errorf("admin: push: connect to %s as %s: %w", url, natsjwt.SystemUser, err)
	}
	defer nc.Close()
	for _, name := range accountsToPush(res, every) {
		pub := accountKey(res, name)
		err := natsjwt.PushAccounts(ctx, nc, map[string]string{pub: res.AccountJWTs[pub]})
		switch {
		case errors.Is(err, natsjwt.ErrPushSkipped):
			p.skipped[name] = true
		case err != nil:
			return p, fmt.Errorf("admin: %w", err)
		default:
			p.took[name] = true
		}
	}
	return p, nil
}

// accountsToPush are the accounts ("account <name>") whose JWTs changed, or every one,
// the tenants' before the core's. The server re-checks every import of the core when
// the core's exports change, and drops one they no longer cover until its account is
// pushed again; a tenant's import the core does not export yet is dropped too, but the
// core's push re-applies it (nats-server's accounts.go, updateAccountClaimsWithRefresh).
// So a version whose exports are narrower (issue 54's exact acknowledgements) keeps every
// tenant's acks working through the push only in this order, and a wider one works in
// either (TestPushKeepsTenantsImports).
func accountsToPush(res natsjwt.Result, every bool) []string {
	var tenants, core []string
	for _, c := range res.Changes {
		switch {
		case !c.Account || !every && c.What == "unchanged":
		case accountKey(res, c.User) == res.Account:
			core = append(core, c.User)
		default:
			tenants = append(tenants, c.User)
		}
	}
	return append(tenants, core...)
}

// accountKey is the public key of an account's change ("account TOOLBUS", "account
// team-x", "account client-x").
func accountKey(res natsjwt.Result, name string) string {
	if team, ok := strings.CutPrefix(name, "account team-"); ok {
		return res.TeamAccounts[team]
	}
	if client, ok := strings.CutPrefix(name, "account client-"); ok {
		return res.ClientAccounts[client]
	}
	return res.Account
}

func writeJSON(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	if err := os.WriteFile(file, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	return nil
}
