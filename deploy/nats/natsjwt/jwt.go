package natsjwt

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

func generateJWT(users []User, kr keyring, g Grants, revoked revocations, o options, write func(string, []byte) (string, error), res *Result) error {
	okp, err := kr.seed("operator.nk", nkeys.CreateOperator)
	if err != nil {
		return err
	}
	opub, _ := okp.PublicKey()
	skp, err := kr.seed("system.nk", nkeys.CreateAccount)
	if err != nil {
		return err
	}
	spub, _ := skp.PublicKey()
	akp, err := kr.seed("account.nk", nkeys.CreateAccount)
	if err != nil {
		return err
	}
	apub, _ := akp.PublicKey()

	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "toolbus"
	oc.SystemAccount = spub
	opJWT, err := kr.kept("operator.jwt", func() (string, error) { return oc.Encode(okp) }, sameOperator(oc))
	if err != nil {
		return err
	}
	sc := jwt.NewAccountClaims(spub)
	sc.Name = "SYS"
	sysJWT, err := kr.kept("system.jwt", func() (string, error) { return sc.Encode(okp) }, sameAccount(sc))
	if err != nil {
		return err
	}
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "TOOLBUS"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	res.Operator, res.System, res.Account = opub, spub, apub
	res.TeamAccounts, res.ClientAccounts, res.AccountJWTs = map[string]string{}, map[string]string{}, map[string]string{}
	var tenants []tenantAccount
	if o.accounts {
		ac.Exports = coreJWTExports(o.respThreshold)
		if tenants, err = tenantAccounts(kr, g); err != nil {
			return err
		}
		for _, t := range tenants {
			if t.team != "" {
				res.TeamAccounts[t.team] = t.pub
			} else {
				res.ClientAccounts[t.client] = t.pub
			}
		}
	}
	signer := func(u User) (nkeys.KeyPair, string) {
		for _, t := range tenants {
			if (u.Team != "" && t.team == u.Team) || (u.Client != "" && t.client == u.Client) {
				return t.kp, t.pub
			}
		}
		return akp, apub
	}
	if err := issueUsers(users, kr, signer, revoked, write, res); err != nil {
		return err
	}
	for key, at := range revoked.all {
		ac.RevokeAt(key, time.Unix(at, 0))
	}
	if b, _ := json.MarshalIndent(revoked.all, "", "  "); len(revoked.all) > 0 {
		if _, err := write(revocationsFile, b); err != nil {
			return err
		}
	}
	accJWT, what, err := kr.keep("account.jwt", func() (string, error) { return ac.Encode(okp) }, sameAccount(ac))
	if err != nil {
		return err
	}
	if o.accounts {
		res.Changes = append(res.Changes, Change{User: "account TOOLBUS", Account: true, What: what})
	}
	res.AccountJWTs[spub], res.AccountJWTs[apub] = sysJWT, accJWT
	if err := issueTenants(tenants, kr, okp, akp, revoked, o.limits, res); err != nil {
		return err
	}
	if o.accounts {
		if res.SystemCreds, err = kr.systemCreds(skp, write); err != nil {
			return err
		}
	}
	cfg := jwtConfig(o, opJWT, spub, res.AccountJWTs)
	res.Config, err = write("auth-jwt.conf", []byte(cfg))
	return err
}

// jwtConfig is auth-jwt.conf: the server settings of o, the operator, the system
// account and the resolver (memory, or full in o.resolverDir) preloaded with the account
// JWTs.
func jwtConfig(o options, opJWT, spub string, accounts map[string]string) string {
	var preload strings.Builder
	for _, pub := range slices.Sorted(maps.Keys(accounts)) {
		fmt.Fprintf(&preload, "  %s: %s\n", pub, accounts[pub])
	}
	layout := ""
	if o.accounts {
		layout = `# The accounts layout: the roles' users in TOOLBUS, each team's executor user in its
# own account (team-<team>), which imports only its tools' subjects, and each bound
# client's user in its own account (client-<name>), which imports only its identities'
# starts, decisions, cancels, answers and reads, with activation tokens of TOOLBUS's
# token-required exports.
`
	}
	resolver := `# The accounts are preloaded into a memory resolver: a reload (kill -HUP) takes new
# preloads, natsjwt.PushAccounts (system.creds, the accounts layout) updates loaded
# accounts without one; a new account needs the reload.
resolver: MEMORY
`
	if o.resolverDir != "" {
		resolver = fmt.Sprintf(`# A full resolver: the server keeps every account JWT in dir (writable by the server;
# keep this file read-only) and takes a new or changed account from a push with
# system.creds ($SYS.REQ.ACCOUNT.<key>.CLAIMS.UPDATE: toolbus admin push, -push), at
# once, with no reload. A reload stores the preload's new accounts but applies no
# changed one: push them. The preload seeds a server started on an empty dir; an
# account removed from the deployment stays in the dir (allow_delete: false).
# In a cluster every node gets a push; a node that was down takes what it missed from
# another node at its next sync (interval): until then it serves its old JWTs, a
# revoked credential or tool included, so the interval is short.
resolver: {
  type: full
  dir: %s
  allow_delete: false
  interval: "10s"
}
`, strconv.Quote(o.resolverDir))
	}
	return fmt.Sprintf(`# Operator/JWT mode for toolbus, written by go run ./deploy/nats/gen: one account
# (TOOLBUS, JetStream enabled), one user per role and one executor user per team, whose
# JWT carries its permissions (permissions.conf; TEAM_EXECUTOR plus the team's tools).
%s# Give each process its <user>.creds file:
#   TOOLBUS_NATS_CREDS=/run/secrets/<user>.creds
# The admin runs toolbus init once.
# Run it with the toolbus binary (kill -HUP reloads it):
#   toolbus server -c auth-jwt.conf -sd /var/lib/toolbus-nats
# It listens on %s (go run ./deploy/nats/gen -listen 0.0.0.0:4222 for other hosts);
# monitoring (/healthz, /varz, /jsz) stays on loopback.
server_name: toolbus-nats-1
listen: %s
http: 127.0.0.1:8222
max_payload: 1MB
# A user JWT carries its permissions and travels in the CONNECT line: the executor's
# is longer than the default limit of 4 KB.
max_control_line: 64KB

jetstream {
  %s
  max_memory_store: 256MB
  max_file_store: 10GB
}

operator: %s
system_account: %s
%sresolver_preload: {
%s}
`, layout, o.listen, o.listen, storeSetting(o), opJWT, spub, resolver, preload.String())
}

// issueUsers writes the .creds of each user whose permissions are new or changed,
// signed by the account signer names (the core, or its team's in the accounts layout), and records the change of every user in res; a changed
// user's old JWT is added to revoked.
func issueUsers(users []User, kr keyring, signer func(User) (nkeys.KeyPair, string), revoked revocations, write func(string, []byte) (string, error), res *Result) error {
	for _, u := range users {
		akp, apub := signer(u)
		res.Creds[u.Name] = filepath.Join(kr.dir, u.Name+".creds")
		old, existed := kr.userJWT(u.Name)
		if existed && old.Issuer == apub && samePermissions(old, u.Perms) {
			res.Changes = append(res.Changes, Change{User: u.Name, What: "unchanged"})
			continue
		}
		what := "new"
		if existed {
			// Its permissions changed. An old JWT that may do more than the new one
			// (a tool revoked) is revoked once the servers load the new account JWT;
			// one that may do less (a tool granted) keeps working, so the team's
			// running processes go on until they take the new credentials.
			what = "changed"
			if narrows(old, u.Perms) {
				revoked.revoke(old)
			}
		}
		creds, err := userCreds(u, akp)
		if err != nil {
			return err
		}
		if _, err = write(u.Name+".creds", creds); err != nil {
			return err
		}
		res.Changes = append(res.Changes, Change{User: u.Name, What: what})
	}
	return nil
}

// responseMax and responseExpires are a user's allow_responses (Permissions.Responses)
// in a JWT: the server's defaults for the config kinds' allow_responses: true.
const (
	responseMax     = 1
	responseExpires = 2 * time.Minute
)

// userCreds is the credentials file of a new user of the account akp: its JWT, carrying
// u's permissions and signed by the account, and its nkey seed.
func userCreds(u User, akp nkeys.KeyPair) ([]byte, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = u.Name
	uc.Pub.Allow, uc.Pub.Deny = u.Perms.PubAllow, u.Perms.PubDeny
	uc.Sub.Allow, uc.Sub.Deny = u.Perms.SubAllow, u.Perms.SubDeny
	if u.Perms.Responses {
		uc.Resp = &jwt.ResponsePermission{MaxMsgs: responseMax, Expires: responseExpires}
	}
	userJWT, err := uc.Encode(akp)
	if err != nil {
		return nil, err
	}
	seed, _ := ukp.Seed()
	return jwt.FormatUserConfig(userJWT, seed)
}
