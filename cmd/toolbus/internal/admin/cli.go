package admin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events/accounts"
)

// usage is the help of toolbus admin (%s: the subcommands that edit).
const usage = `usage: toolbus admin <subcommand> [flags] [args]
  administer a deployment's NATS credentials, kept in one directory (-dir; default
  toolbus/nats in the user's configuration directory: it holds secrets). Each subcommand
  but init edits the directory's grants.json and issues again with the same keys: only
  the tenant named changes, every other file stays byte for byte, no other process
  restarts. It prints what changed and what to hand to whom.

subcommands:
  init [-one-account] [-listen host:port] [-store DIR] [-resolver-dir DIR | -memory-resolver]
       [-tenant-conns N] [-tenant-subs N] [-tenant-leafnodes N] [-core-wide] [-auth jwt|...|all]
                           create a deployment once (keys, credentials, server configs, an empty
                           grants.json); refuses a directory that holds one. The accounts layout
                           (one account per team) unless -one-account, its auth-jwt.conf with a
                           full resolver (edits with -push need no reload) unless -memory-resolver;
                           each tenant account capped in connections, subscriptions, leaf nodes;
                           no core-wide executor or client credentials unless -core-wide;
                           one secret file per user (its .creds) unless -auth names more kinds
%s
  publish-keys [-server URL]
                           publish the signing keys' public halves (signers.json) to the core's
                           bucket toolbus_signers, with admin's credentials (admin.creds of -dir)
flags (-dir everywhere; -push and -server for the subcommands that edit):
`

// Main runs toolbus admin with args (the subcommand first); url is TOOLBUS_NATS_URL.
// It returns the exit code: 0 done, 1 refused or failed, 2 a usage error.
func Main(ctx context.Context, args []string, url string, stdout, stderr io.Writer) int {
	if len(args) == 0 || isHelp(args[0]) {
		w, code := stderr, 2
		if len(args) > 0 {
			w, code = stdout, 0
		}
		printUsage(w)
		return code
	}
	name, rest := args[0], args[1:]
	var err error
	if name == "init" {
		err = runInit(rest, stdout, stderr)
	} else if name == "publish-keys" {
		err = runPublishKeys(ctx, rest, url, stdout, stderr)
	} else if i := slices.IndexFunc(edits, func(e edit) bool { return e.name == name }); i >= 0 {
		err = runEdit(ctx, edits[i], rest, url, stdout, stderr)
	} else {
		fmt.Fprintf(stderr, "toolbus admin: unknown subcommand %q\n", name)
		printUsage(stderr)
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "toolbus admin %s: %s\n", name, ue)
		return 2
	}
	fmt.Fprintf(stderr, "toolbus admin %s: %v\n", name, err)
	return 1
}

type usageError string

func (e usageError) Error() string { return string(e) }

func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

func printUsage(w io.Writer) {
	var subs strings.Builder
	for _, e := range edits {
		line := "  " + strings.TrimSpace(e.name+" "+e.args)
		if len(line) > 26 {
			line += "\n" + strings.Repeat(" ", 27)
		} else {
			line += strings.Repeat(" ", 27-len(line))
		}
		subs.WriteString(line + e.what + "\n")
	}
	fmt.Fprintf(w, usage, strings.TrimRight(subs.String(), "\n"))
	all := flag.NewFlagSet("admin", flag.ContinueOnError)
	initFlags(all)
	editFlags(all, true)
	all.SetOutput(w)
	all.PrintDefaults()
}

// dirFlag is -dir, defaulting to where go run ./deploy/nats/gen writes.
func dirFlag(fs *flag.FlagSet) *string {
	return fs.String("dir", "", "the deployment's directory (default: toolbus/nats in the user's configuration directory, as gen's -out)")
}

type initOpts struct {
	dir                      *string
	accounts, oneAcc, memRes *bool
	coreWide                 *bool
	listen, store, resDir    *string
	auth                     *string
	limits                   func() accounts.TenantLimits
}

func initFlags(fs *flag.FlagSet) initOpts {
	d := accounts.DefaultTenantLimits
	conns := fs.Int("tenant-conns", d.Conns, "init: the most connections of each team's and client's account (accounts layout; -1: no limit); the server refuses one more")
	subs := fs.Int("tenant-subs", d.Subs, "init: the most subscriptions of each connection of a team's or client's account (accounts layout; -1: no limit); the server refuses one more")
	leafs := fs.Int("tenant-leafnodes", d.Leafnodes, "init: the most leaf node connections of each team's and client's account (accounts layout; -1: no limit)")
	payload := fs.Int("tenant-payload", d.Payload, "init: the largest message in bytes a connection of a team's or client's account may publish (accounts layout; -1: no limit); the server closes one that publishes more")
	return initOpts{
		limits: func() accounts.TenantLimits {
			return accounts.TenantLimits{Conns: *conns, Subs: *subs, Leafnodes: *leafs, Payload: *payload}
		},
		dir:      dirFlag(fs),
		auth:     fs.String("auth", natsjwt.KindJWT, "init: the kinds of credentials issued, each a server config and one secret file per user: jwt (auth-jwt.conf, <user>.creds), users (auth-users.conf, <user>.password, k8s-secrets.yaml), nkeys (auth-nkeys.conf, <user>.nk); jwt and those added with commas (jwt,users), or all"),
		accounts: fs.Bool("accounts", true, "init: the accounts layout, one account per team (the default: teams that do not trust each other)"),
		oneAcc:   fs.Bool("one-account", false, "init: one account for the roles and every team instead (teams that trust each other)"),
		listen:   fs.String("listen", natsjwt.DefaultListen, "init: client address (host:port) the server configs listen on; 0.0.0.0:4222 for every interface"),
		store:    fs.String("store", "", "init: JetStream store directory written into the server configs (default: none, give it to the server: toolbus server -sd DIR)"),
		resDir:   fs.String("resolver-dir", "", "init: the directory where the server's full resolver stores the account JWTs, writable by the server, as it sees it (default: resolver under -store, else under -dir)"),
		coreWide: fs.Bool("core-wide", false, "init: also issue the core account's shared executor (serves every team's tools, reads every run) and client (acts and reads as anyone) in the accounts layout, for teams that trust each other (-one-account always has them)"),
		memRes:   fs.Bool("memory-resolver", false, "init: a memory resolver instead of a full one (accounts layout): a new team or client then needs a reload besides -push (-one-account always has one)"),
	}
}

type editOpts struct {
	dir    *string
	push   *bool
	server *string
}

func editFlags(fs *flag.FlagSet, noDir bool) editOpts {
	var o editOpts
	if !noDir {
		o.dir = dirFlag(fs)
	}
	o.push = fs.Bool("push", false, "push the changed account JWTs to the running servers with the deployment's system.creds (the accounts layout): no reload, every connection kept; a new team or client too, but with a memory resolver (init -memory-resolver) a new account needs a reload")
	o.server = fs.String("server", "", "the server to push to (default: TOOLBUS_NATS_URL)")
	return o
}

// parse parses args with fs, flags before, between and after the arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError(err.Error())
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		if args = fs.Args(); args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

func newFlagSet(name, args string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("admin "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: toolbus admin %s [flags]\n", strings.TrimSpace(name+" "+args))
		fs.PrintDefaults()
	}
	return fs
}

func defaultDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	return natsjwt.DefaultDir()
}

func runInit(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("init", "", stderr)
	o := initFlags(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError(fmt.Sprintf("unexpected argument %q", pos[0]))
	}
	dir, err := defaultDir(*o.dir)
	if err != nil {
		return err
	}
	s := Settings{Accounts: *o.accounts && !*o.oneAcc, Listen: *o.listen, Store: *o.store}
	if s.Auth, err = natsjwt.ParseKinds(*o.auth); err != nil {
		return usageError("-auth: " + err.Error())
	}
	if *o.coreWide && !s.Accounts {
		return usageError("-core-wide is the accounts layout's: -one-account always issues the shared executor and client")
	}
	s.NoCoreWide = s.Accounts && !*o.coreWide
	if s.Accounts {
		s.TenantLimits = o.limits()
		if err := s.TenantLimits.Validate(); err != nil {
			return usageError(err.Error())
		}
	}
	switch {
	case *o.resDir != "" && (*o.memRes || !s.Accounts):
		return usageError("-resolver-dir is the full resolver's, which -memory-resolver and -one-account do not have")
	case *o.resDir != "":
		s.ResolverDir = *o.resDir
	case s.Accounts && !*o.memRes:
		if s.ResolverDir, err = defaultResolverDir(dir, s); err != nil {
			return err
		}
	}
	return Init(dir, s, stdout)
}

func runEdit(ctx context.Context, e edit, args []string, url string, stdout, stderr io.Writer) error {
	fs := newFlagSet(e.name, e.args, stderr)
	o := editFlags(fs, false)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < e.min || (e.max >= 0 && len(pos) > e.max) {
		return usageError(fmt.Sprintf("usage: toolbus admin %s (got %d arguments)", strings.TrimSpace(e.name+" "+e.args), len(pos)))
	}
	dir, err := defaultDir(*o.dir)
	if err != nil {
		return err
	}
	d, err := open(dir)
	if err != nil {
		return err
	}
	if *o.server != "" {
		url = *o.server
	}
	toPush := *o.push || e.name == "push"
	if err := canPush(toPush, d.settings, url); err != nil {
		return err
	}
	g := cloneGrants(d.grants)
	var rotate []string
	switch {
	case e.rotate:
		if err := checkRotate(d.settings, g, pos[0]); err != nil {
			return err
		}
		rotate = pos
	case e.apply != nil:
		if err := e.apply(&g, pos); err != nil {
			return err
		}
	}
	before := d.grants
	res, err := d.issue(g, rotate...)
	if err != nil {
		return err
	}
	var p pushed
	var perr error
	if toPush {
		p, perr = d.push(ctx, url, res, e.name == "push")
	}
	report(stdout, res, p)
	fmt.Fprintf(stdout, "signing keys: a new or rotated user's <user>.sign goes with its credentials (TOOLBUS_SIGNING_KEY); toolbus admin publish-keys publishes %s\n", KeyringFile)
	if e.next != nil {
		fmt.Fprintln(stdout, e.next(pos))
	}
	if perr != nil {
		return fmt.Errorf("the files are written, the push failed (reload the servers, or toolbus admin push): %w", perr)
	}
	if toPush {
		d.syncCatalog(ctx, url, before, p, stdout)
	}
	return nil
}

// canPush refuses a push that cannot be made, before anything is written.
func canPush(push bool, s Settings, url string) error {
	switch {
	case !push:
		return nil
	case !s.Accounts:
		return refused("-push needs the system user (system.creds), which only the accounts layout issues: reload the server instead (kill -HUP)")
	case url == "":
		return refused("-push needs the server: set TOOLBUS_NATS_URL or give -server URL")
	}
	return nil
}

// report prints what changed, what each change needs and the files to hand out.
func report(w io.Writer, res natsjwt.Result, p pushed) {
	var changed []natsjwt.Change
	var unchanged []string
	for _, c := range res.Changes {
		if c.What == "unchanged" && !p.took[c.User] {
			unchanged = append(unchanged, natsjwt.Shown(c.User))
			continue
		}
		changed = append(changed, c)
	}
	if len(changed) == 0 {
		fmt.Fprintln(w, "nothing changed")
	}
	full := res.ResolverDir != ""
	natsjwt.WriteChanges(w, changed, func(c natsjwt.Change) bool { return p.took[c.User] }, full)
	if len(unchanged) > 0 {
		fmt.Fprintf(w, "unchanged (files byte for byte as they were): %s\n", strings.Join(unchanged, ", "))
	}
	for _, c := range changed {
		if !c.Account && c.What != "removed" {
			fmt.Fprintf(w, "hand to the holders of %s:\n", c.User)
			natsjwt.WriteUser(w, res, c.User)
		}
	}
	if !full && len(p.took)+len(p.skipped) == 0 && slices.ContainsFunc(changed, func(c natsjwt.Change) bool {
		return c.Account && (c.What == "changed" || c.What == "removed")
	}) {
		fmt.Fprintln(w, "or apply the changed accounts with no reload: toolbus admin push (-push with the edit)")
	}
	for _, name := range slices.Sorted(maps.Keys(p.skipped)) {
		why := "new"
		if !slices.ContainsFunc(res.Changes, func(c natsjwt.Change) bool { return c.User == name && c.What == "new" }) {
			// A memory resolver loads an account when a connection first uses it.
			why = "no connection has used it since they started"
		}
		fmt.Fprintf(w, "reload needed: the running servers have not loaded %s (%s): reload them once (kill -HUP of toolbus server, nats-server --signal reload); every connection is kept\n", natsjwt.Shown(name), why)
	}
}

func cloneGrants(g natsjwt.Grants) natsjwt.Grants {
	out := natsjwt.Grants{Teams: map[string][]string{}}
	for k, v := range g.Teams {
		out.Teams[k] = slices.Clone(v)
	}
	if g.Clients != nil {
		out.Clients = map[string][]string{}
		for k, v := range g.Clients {
			out.Clients[k] = slices.Clone(v)
		}
	}
	return out
}
