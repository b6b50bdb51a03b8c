// Package natsjwt issues the credentials of toolbus from deploy/nats/permissions.conf
// and an administrator's grants (which team serves which tools): one user per role and
// one executor user per team, in each kind NATS offers: user/password (bcrypt hashes in
// the server config, the passwords in files), nkeys (public keys in the server config,
// the seeds in files) and the operator/JWT setup (an operator, a system account, a
// TOOLBUS account with JetStream, and one user JWT per user carrying its permissions).
// `go run ./deploy/nats/gen` calls it; the security tests start servers from what it
// writes.
package natsjwt

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/events"
)

// Result is what Generate wrote.
type Result struct {
	// Config is the server configuration of the operator/JWT setup (auth-jwt.conf):
	// listen, JetStream, operator, system account and a resolver preloaded with the
	// account JWTs: a memory resolver, or a full one (WithFullResolver).
	Config string
	// ResolverDir is the full resolver's directory in Config ("": a memory resolver).
	ResolverDir string
	// UsersConfig (auth-users.conf) and NkeysConfig (auth-nkeys.conf) are the server
	// configurations of the user/password and nkey setups: single.conf's settings and
	// one user per role and team with its permissions inline.
	UsersConfig, NkeysConfig string
	// Creds maps each user (role, or TeamUser) to its credentials file
	// (TOOLBUS_NATS_CREDS), Passwords to the file holding its password
	// (TOOLBUS_NATS_USER=<user>, TOOLBUS_NATS_PASSWORD), Seeds to its nkey seed file
	// (TOOLBUS_NATS_NKEY).
	Creds, Passwords, Seeds map[string]string
	// Operator, System and Account are the public keys.
	Operator, System, Account string
	// TeamAccounts maps each team to its account's public key in the accounts layout
	// (WithAccounts), ClientAccounts each bound client (and each removed client whose
	// account is kept to revoke its users) to its; AccountJWTs maps every account's
	// public key (system, core, teams, clients) to its JWT, as auth-jwt.conf preloads
	// them (PushAccounts pushes them).
	TeamAccounts, ClientAccounts, AccountJWTs map[string]string
	// SystemCreds (system.creds, the accounts layout) is a user of the system account
	// that may only push account JWTs to the servers (PushAccounts).
	SystemCreds string
	// Env is, for each team's executor user, the settings its executors run with
	// besides its credentials: TOOLBUS_TEAM, TOOLBUS_EXECUTOR_TOOLS and, in the accounts
	// layout, TOOLBUS_NATS_API_PREFIX=JS.core.API (CoreAPIPrefix); in the accounts layout,
	// for each bound client's user, TOOLBUS_NATS_READ_PREFIX of its first identity
	// (events.ReadAPIPrefix) and ReadPrefixNote. An entry starting with "#" is a comment.
	Env map[string][]string
	// K8sSecrets (k8s-secrets.yaml) holds one Kubernetes Secret per user,
	// toolbus-nats-<user> with the keys user, password and bcrypt, in the shape the
	// manifests of deploy/k8s read (deploy/README.md, "Kubernetes").
	K8sSecrets string
	// Changes says, user by user, what this run did: a run on a directory that holds
	// a deployment's keys keeps them and every credential whose permissions did not
	// change.
	Changes []Change
}

// Generate writes the credentials of the roles of permsFile, without teams (see
// GenerateGrants).
func Generate(permsFile, dir string) (Result, error) { return GenerateGrants(permsFile, dir, Grants{}) }

// GenerateGrants writes, into dir, for every role of permsFile and every team and
// bound client of g:
// auth-jwt.conf and one <user>.creds; auth-users.conf and one <user>.password;
// auth-nkeys.conf and one <user>.nk; plus the seeds of the operator, the system account
// and the account (operator.nk, system.nk, account.nk: keep them offline, they sign new
// users). A directory that already holds them is a deployment's: its keys, passwords
// and nkeys are kept, a user whose permissions did not change keeps its .creds file
// as it was, a user no longer granted is removed (its JWT revoked), and Result.Changes
// says which is which. Adding a team or a bound client then needs nothing on a server
// in operator mode with one account, in the accounts layout a push of its new account
// (PushAccounts) with a full resolver (WithFullResolver) or a reload with the memory
// one; the users and nkeys configs need a reload (SIGHUP: kill -HUP the toolbus server,
// or nats-server --signal reload), which keeps every connection. The
// server settings of auth-users.conf and auth-nkeys.conf are those of single.conf, next
// to permsFile, listening on loopback (WithListen) and storing where WithStoreDir says.
// WithAccounts issues the accounts layout: also team-<team>.nk and team-<team>.jwt per
// team and account-client-<name>.nk and .jwt per bound client (its account's key and
// JWT, kept) and system.creds (PushAccounts). A client removed from g keeps its account,
// issued with no import and its users revoked, so that the servers cut them when they
// take it (a reload, a push).
func GenerateGrants(permsFile, dir string, g Grants, opts ...Option) (Result, error) {
	o := options{bcryptCost: bcrypt.DefaultCost, listen: DefaultListen}
	for _, f := range opts {
		f(&o)
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return Result{}, fmt.Errorf("natsjwt: listen address %q: %w", o.listen, err)
	}
	if err := g.Validate(); err != nil {
		return Result{}, fmt.Errorf("natsjwt: grants: %w", err)
	}
	if err := o.limits.Validate(); err != nil {
		return Result{}, fmt.Errorf("natsjwt: %w", err)
	}
	if len(o.kinds) > 0 && !o.issues(KindJWT) {
		return Result{}, errors.New("natsjwt: the kinds of credentials must include jwt (ParseKinds)")
	}
	if o.resolverDir != "" && !o.accounts {
		return Result{}, errors.New("natsjwt: a full resolver needs the accounts layout (WithAccounts): it takes changed accounts from a push with system.creds, which only that layout issues")
	}
	perms, err := ReadPermissions(permsFile)
	if err != nil {
		return Result{}, err
	}
	single, err := serverSettings(filepath.Join(filepath.Dir(permsFile), "single.conf"), o)
	if err != nil {
		return Result{}, err
	}
	if len(g.Clients) > 0 {
		if _, err := ClientPermissions(perms["client"], nil); err != nil {
			return Result{}, err
		}
	}
	users := Users(perms, g)
	if o.accounts && o.noCoreWide {
		users = slices.DeleteFunc(users, func(u User) bool { return !u.tenant() && slices.Contains(CoreWide, u.Name) })
	}
	if o.accounts {
		// A team's user lives in its team's account, which holds nothing but the
		// imports of its tools (TeamExports), and a client's in its client's account
		// (ClientExports): the account is the boundary, so the user is left open inside
		// it (one list of what crosses, not two that may drift).
		for i := range users {
			switch {
			case users[i].tenant():
				users[i].Perms = Permissions{}
			case users[i].Name == "injector":
				users[i].Perms = withWriteForwards(users[i].Perms)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Result{}, fmt.Errorf("natsjwt: %w", err)
	}
	write := func(name string, data []byte) (string, error) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return "", fmt.Errorf("natsjwt: %w", err)
		}
		return p, nil
	}
	res := Result{Creds: map[string]string{}, Passwords: map[string]string{}, Seeds: map[string]string{}, ResolverDir: o.resolverDir}
	kr := keyring{dir: dir}
	if err := issueKept(users, kr, g, o, write, &res); err != nil {
		return Result{}, err
	}
	res.Env = tenantEnv(users, g, o)
	if err := dropKinds(dir, users, o); err != nil {
		return Result{}, err
	}
	if err := writeConfigKinds(users, g, o, kr, single, write, &res); err != nil {
		return Result{}, err
	}
	return res, nil
}

// ReadPrefixNote is the comment line of a client's settings in the accounts layout
// (Result.Env): the read prefix names one identity.
const ReadPrefixNote = "# a client bound to several identities sets TOOLBUS_NATS_READ_PREFIX per identity: toolbus_read.<identity>.API"

// tenantEnv is what each team's executors run with besides their credentials and, in
// the accounts layout, what each bound client runs with: the read service's prefix of
// its first identity (events.ReadAPIPrefix), and ReadPrefixNote.
func tenantEnv(users []User, g Grants, o options) map[string][]string {
	env := map[string][]string{}
	for _, u := range users {
		if u.Client != "" && o.accounts {
			env[u.Name] = []string{"TOOLBUS_NATS_READ_PREFIX=" + events.ReadAPIPrefix(g.Clients[u.Client][0]), ReadPrefixNote}
		}
		if u.Team == "" {
			continue
		}
		env[u.Name] = []string{"TOOLBUS_TEAM=" + u.Team, "TOOLBUS_EXECUTOR_TOOLS=" + strings.Join(g.Teams[u.Team], ",")}
		if o.accounts {
			env[u.Name] = append(env[u.Name], "TOOLBUS_NATS_API_PREFIX="+CoreAPIPrefix)
		}
	}
	return env
}

// issueKept issues the operator/JWT setup from the keys kept in kr: removed users' files
// go (their JWTs revoked), rotated users' credentials are forgotten, and the changes of
// every user land in res.
func issueKept(users []User, kr keyring, g Grants, o options, write func(string, []byte) (string, error), res *Result) error {
	revoked, err := kr.revocations()
	if err != nil {
		return err
	}
	if res.Changes, err = kr.removed(users, revoked); err != nil {
		return err
	}
	if err := kr.rotate(users, o.rotate, revoked); err != nil {
		return err
	}
	if err := generateJWT(users, kr, g, revoked, o, write, res); err != nil {
		return err
	}
	for i, c := range res.Changes {
		if slices.Contains(o.rotate, c.User) {
			res.Changes[i].What = "rotated"
		}
	}
	return nil
}
