// Command gen issues the NATS credentials of toolbus: one user per role and, from an
// administrator's grants, one executor user per team that may serve only the team's
// tools (see package natsjwt). It writes every kind NATS offers:
//
//	go run ./deploy/nats/gen [-perms deploy/nats/permissions.conf] [-grants grants.json] [-out DIR] [-rotate user,...]
//	                         [-listen 127.0.0.1:4222] [-store DIR] [-accounts]
//	                         [-tenant-conns 1000] [-tenant-subs 10000] [-tenant-leafnodes 0]
//
// Run again on the same -out, it keeps the deployment's keys and every credential whose
// permissions did not change, and prints what changed (see natsjwt.GenerateGrants).
// toolbus admin (package cmd/toolbus/internal/admin) does the same as commands, with no checkout:
// init once, then add-team, grant, revoke... on the directory it keeps.
//
// It runs from any directory of the checkout (go run ../../deploy/nats/gen from a
// subdirectory works too): -perms defaults to this checkout's deploy/nats/permissions.conf,
// and -out to toolbus/nats under the user's configuration directory ($XDG_CONFIG_HOME, else
// ~/.config on Linux), outside the repository: what it writes are secrets.
//
// grants.json:
//
//	{"teams": {"payments": ["refund", "ledger_lookup"], "search": ["web_search"]},
//	 "clients": {"alice": ["alice"], "helpdesk": ["alice", "bob"]}}
//
// A team gets executor credentials that serve only its tools; a client entry gets client
// credentials that start runs only for, and approve, deny and cancel only as, the
// identities listed (the principal id of run.started, the who of decisions and cancels).
//
// Then run a server with one of the configs written into -out (the toolbus binary runs
// one: toolbus server -c <out>/auth-jwt.conf -sd ./nats-data). They listen on
// -listen (loopback unless told otherwise) and store in -store, or where -sd says:
//
//	auth-jwt.conf     operator/JWT: give each process its <user>.creds (TOOLBUS_NATS_CREDS)
//	auth-users.conf   users and passwords (bcrypt): TOOLBUS_NATS_USER=<user>, TOOLBUS_NATS_PASSWORD=$(cat <user>.password)
//	auth-nkeys.conf   nkeys: TOOLBUS_NATS_NKEY=<user>.nk
//	k8s-secrets.yaml  one Kubernetes Secret per user (toolbus-nats-<user>: user, password, bcrypt) for deploy/k8s
//
// where <user> is a role (admin, planner, executor, injector, client),
// executor-<team> or client-<name>. The output directory holds secrets: keep it out of git.
//
// With -accounts it issues the accounts layout (docs/tenancy-design.md; natsjwt.WithAccounts)
// in every kind: a core account holding the stream, the buckets and every role's user,
// and one account per team holding its executor-<team> user, which imports of the core
// only its tools' queues, results, keys and doorbells (natsjwt.TeamExports), the JetStream
// API under JS.core.API: its executors run with TOOLBUS_NATS_API_PREFIX=JS.core.API (gen
// prints each team's settings). In operator mode each team's account has its own key
// (team-<team>.nk, kept) and imports with activation tokens of the core's token-required
// exports, so granting a tool changes only that team's account JWT. A reload of the
// running server (kill -HUP) applies a new tool or team; the users and nkeys configs take
// a new team's imports on a second reload (nats-server 2.15). Each bound client gets an
// account of its own too (CLIENT_<name>, in operator mode client-<name> with its key in
// account-client-<name>.nk), holding its client-<name> user, which imports only its
// identities' starts, decisions, cancels, answers and read service (natsjwt.ClientExports):
// it runs with TOOLBUS_NATS_READ_PREFIX=toolbus_read.<identity>.API (gen prints it). Off by
// default: toolbus admin init issues it. With -resolver-dir DIR (and -accounts)
// auth-jwt.conf has a full resolver storing the account JWTs in DIR instead of a memory
// one: a push (natsjwt.PushAccounts, toolbus admin push) then takes a new team or client
// too, with no reload, and a reload takes no changed account (push it). Every team's and
// client's account is capped (accounts.TenantLimits, in every kind): -tenant-conns
// connections, -tenant-subs subscriptions per connection, -tenant-leafnodes leaf nodes,
// -tenant-payload the largest message
// (defaults accounts.DefaultTenantLimits; -1 lifts one); the core account is not.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events/accounts"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is main without the process: the tests call it.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	perms := fs.String("perms", "", "role permissions (default: deploy/nats/permissions.conf of this checkout)")
	grants := fs.String("grants", "", "grants file: the tools of each team and the identities of each bound client (JSON, {\"teams\": {\"<team>\": [\"<tool>\", ...]}, \"clients\": {\"<name>\": [\"<identity>\", ...]}})")
	listen := fs.String("listen", natsjwt.DefaultListen, "client address (host:port) the server configs listen on; 0.0.0.0:4222 for every interface")
	storeDir := fs.String("store", "", "JetStream store directory written into the server configs (default: none, give it to the server: toolbus server -sd DIR)")
	rotate := fs.String("rotate", "", "comma-separated users to issue new credentials for (new password, nkey and JWT; the old JWT is revoked); everyone else's are kept")
	accountsLayout := fs.Bool("accounts", false, "the accounts layout: a core account for the roles, one account per team for its executors, which import only their tools' subjects, and one per bound client, which imports only its identities' (natsjwt.WithAccounts; their executors need TOOLBUS_NATS_API_PREFIX=JS.core.API, the clients TOOLBUS_NATS_READ_PREFIX)")
	resolverDir := fs.String("resolver-dir", "", "with -accounts: auth-jwt.conf gets a full resolver storing the account JWTs in this directory (writable by the server; as the server sees it), which takes new and changed accounts from a push (natsjwt.PushAccounts) with no reload (default: a memory resolver, which takes new accounts on a reload)")
	d := accounts.DefaultTenantLimits
	conns := fs.Int("tenant-conns", d.Conns, "with -accounts: the most connections of each team's and client's account (-1: no limit); the server refuses one more")
	subs := fs.Int("tenant-subs", d.Subs, "with -accounts: the most subscriptions of each connection of a team's or client's account (-1: no limit); the server refuses one more")
	leafs := fs.Int("tenant-leafnodes", d.Leafnodes, "with -accounts: the most leaf node connections of each team's and client's account (-1: no limit)")
	payload := fs.Int("tenant-payload", d.Payload, "with -accounts: the largest message in bytes a connection of a team's or client's account may publish (-1: no limit)")
	out := fs.String("out", "", "output directory, created 0700 (default: toolbus/nats in the user's configuration directory, outside the repository: it holds secrets)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var rot []string
	if *rotate != "" {
		rot = strings.Split(*rotate, ",")
	}
	opts := []natsjwt.Option{natsjwt.WithRotate(rot...), natsjwt.WithListen(*listen), natsjwt.WithStoreDir(*storeDir),
		natsjwt.WithTenantLimits(accounts.TenantLimits{Conns: *conns, Subs: *subs, Leafnodes: *leafs, Payload: *payload})}
	if *accountsLayout {
		opts = append(opts, natsjwt.WithAccounts())
	}
	if *resolverDir != "" {
		opts = append(opts, natsjwt.WithFullResolver(*resolverDir))
	}
	if err := generate(*perms, *grants, *out, opts, stdout); err != nil {
		fmt.Fprintln(stderr, "gen:", err)
		return 1
	}
	return 0
}

func generate(perms, grants, out string, opts []natsjwt.Option, stdout io.Writer) error {
	var err error
	if perms == "" {
		if perms, err = defaultPerms(); err != nil {
			return err
		}
	}
	if out == "" {
		if out, err = natsjwt.DefaultDir(); err != nil {
			return fmt.Errorf("%w: give -out", err)
		}
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	var g natsjwt.Grants
	if grants != "" {
		if g, err = natsjwt.ReadGrants(grants); err != nil {
			return err
		}
	}
	res, err := natsjwt.GenerateGrants(perms, out, g, opts...)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "wrote the credentials (secrets) to", out)
	fmt.Fprintln(stdout, "server configs:", res.Config, res.UsersConfig, res.NkeysConfig)
	fmt.Fprintln(stdout, "kubernetes secrets:", res.K8sSecrets)
	for _, u := range natsjwt.Users(nil, g) {
		natsjwt.WriteUser(stdout, res, u.Name)
	}
	// What this run changed, and whom to hand what: a directory that held a
	// deployment's keys keeps them and every credential whose permissions did not change.
	natsjwt.WriteChanges(stdout, res.Changes, nil, res.ResolverDir != "")
	return nil
}

// defaultPerms finds deploy/nats/permissions.conf: beside this program's source (go run,
// from any directory), else in the working directory or one above it.
func defaultPerms() (string, error) {
	var tried []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		p := filepath.Join(filepath.Dir(file), "..", "permissions.conf")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		tried = append(tried, p)
	}
	dir, err := os.Getwd()
	for err == nil {
		p := filepath.Join(dir, "deploy", "nats", "permissions.conf")
		if _, serr := os.Stat(p); serr == nil {
			return p, nil
		}
		tried = append(tried, p)
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", fmt.Errorf("no permissions file (looked for %v): give -perms path/to/deploy/nats/permissions.conf", tried)
}
