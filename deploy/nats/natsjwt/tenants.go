package natsjwt

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/toolbus/toolbus/events/accounts"
)

// ClientExports is accounts.ClientExports.
func ClientExports(ids []string) []Crossing { return accounts.ClientExports(ids) }

// ClientAccount is accounts.ClientAccount: the config kinds' name of a client's account.
func ClientAccount(client string) string { return accounts.ClientAccount(client) }

// clientKeyPrefix starts the names of the files of a client's account in the JWT kind
// (account-client-<name>.nk and .jwt): not client-<name>, which are its user's files.
const clientKeyPrefix = "account-client-"

// tenantAccount is an account of the accounts layout beside the core in the JWT kind: a
// team's or a bound client's, with its own key (kept) and its imports.
type tenantAccount struct {
	// name is the JWT's name: team-<team> or client-<name>.
	name string
	// file is its key's and JWT's file name without the extension.
	file      string
	team      string
	client    string
	kp        nkeys.KeyPair
	pub       string
	crossings []Crossing
}

// tenantAccounts are the accounts of the teams and clients of g, and of the teams and
// clients removed from g whose account key the directory keeps: such an account is
// issued with no import, so that the servers, taking its JWT (a reload, a push), cut its
// users, whose keys it revokes (revocations).
func tenantAccounts(kr keyring, g Grants) ([]tenantAccount, error) {
	var out []tenantAccount
	for _, team := range kr.withKept(teamKeyPrefix, slices.Collect(maps.Keys(g.Teams))) {
		var crossings []Crossing
		if tools, ok := g.Teams[team]; ok {
			crossings = TeamExports(team, tools)
		}
		out = append(out, tenantAccount{name: teamKeyPrefix + team, file: teamKeyPrefix + team, team: team, crossings: crossings})
	}
	for _, c := range kr.withKept(clientKeyPrefix, slices.Collect(maps.Keys(g.Clients))) {
		var crossings []Crossing
		if ids, ok := g.Clients[c]; ok {
			crossings = ClientExports(ids)
		}
		out = append(out, tenantAccount{name: ClientUser(c), file: clientKeyPrefix + c, client: c, crossings: crossings})
	}
	for i := range out {
		kp, err := kr.seed(out[i].file+".nk", nkeys.CreateAccount)
		if err != nil {
			return nil, err
		}
		out[i].kp, out[i].pub = kp, mustPublic(kp)
	}
	return out, nil
}

// withKept is names (the granted teams or clients) with those removed since whose
// account key (prefix) the directory keeps, sorted.
func (k keyring) withKept(prefix string, names []string) []string {
	for name := range k.accountKeys(prefix) {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// teamKeyPrefix starts the names of the files of a team's account in the JWT kind
// (team-<team>.nk and .jwt).
const teamKeyPrefix = "team-"

// accountKeys are the public keys of the team or client accounts (prefix teamKeyPrefix
// or clientKeyPrefix) whose keys the directory keeps, by team or client name.
func (k keyring) accountKeys(prefix string) map[string]string {
	out := map[string]string{}
	files, _ := filepath.Glob(filepath.Join(k.dir, prefix+"*.nk")) //nolint:errcheck // the pattern is valid
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			continue
		}
		out[strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), prefix), ".nk")] = mustPublic(kp)
	}
	return out
}

// revocations are the user keys revoked in operator mode. A key a team's or client's
// account issued goes into that account's JWT only (its kept JWT carries them from run
// to run), so that rotating, narrowing or removing one tenant's user changes no other
// account: pushing the core account's JWT makes every server rebuild the core's exports,
// which drops the response mappings of every tenant's pull in flight (nats-server
// resets the account's exports, responses included, on a claims update): a call
// delivered to such a pull reaches nobody, and the pull stays dead until its executor
// misses its heartbeats (docs/deployment-and-security.md, "Day two disturbs nobody
// else"). All (revocationsFile) holds the
// keys the core account issued, and those tenants' keys revoked before they were kept
// per account: it goes into the core's and every team's account JWT, as it always did.
type revocations struct {
	all map[string]int64
	// tenant: by the public key of a team's or client's account.
	tenant map[string]map[string]int64
}

// revoke revokes uc's key from now on, in the JWT of the account that issued it when
// that is a team's or client's, else in every account's (all: it reports so).
func (r revocations) revoke(uc *jwt.UserClaims) bool {
	now := time.Now().Unix()
	if m, ok := r.tenant[uc.Issuer]; ok {
		m[uc.Subject] = now
		return false
	}
	r.all[uc.Subject] = now
	return true
}

// revocations reads revocationsFile and the revocations the kept JWTs of the team and
// client accounts carry.
func (k keyring) revocations() (revocations, error) {
	r := revocations{all: map[string]int64{}, tenant: map[string]map[string]int64{}}
	for _, prefix := range []string{teamKeyPrefix, clientKeyPrefix} {
		for name, pub := range k.accountKeys(prefix) {
			r.tenant[pub] = map[string]int64{}
			if b, err := os.ReadFile(filepath.Join(k.dir, prefix+name+".jwt")); err == nil {
				if c, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(b))); err == nil && c.Subject == pub {
					maps.Copy(r.tenant[pub], c.Revocations)
				}
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(k.dir, revocationsFile))
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("natsjwt: %w", err)
	}
	if err := json.Unmarshal(b, &r.all); err != nil {
		return r, fmt.Errorf("natsjwt: %s: %w", revocationsFile, err)
	}
	return r, nil
}

// issueTenants issues the JWT of each account of tenants (the accounts layout), its
// imports from the core account (corePub, whose key ckp signs their activations), and
// records them in res. Each carries the tenant limits lim (accounts.TenantLimits), as
// the config kinds' limits blocks do.
func issueTenants(tenants []tenantAccount, kr keyring, okp, ckp nkeys.KeyPair, revoked revocations, lim accounts.TenantLimits, res *Result) error {
	corePub := mustPublic(ckp)
	r := lim.Resolved()
	for _, t := range tenants {
		tc := jwt.NewAccountClaims(t.pub)
		tc.Name = t.name
		tc.Limits.Conn, tc.Limits.Subs, tc.Limits.LeafNodeConn, tc.Limits.Payload = int64(r.Conns), int64(r.Subs), int64(r.Leafnodes), int64(r.Payload)
		for key, at := range revoked.tenant[t.pub] {
			tc.RevokeAt(key, time.Unix(at, 0))
		}
		if t.team != "" {
			for key, at := range revoked.all {
				tc.RevokeAt(key, time.Unix(at, 0))
			}
		}
		sign := func(act *jwt.ActivationClaims) (string, error) { return act.Encode(ckp) }
		var err error
		if tc.Imports, err = teamJWTImports(corePub, t.pub, t.crossings, sign); err != nil {
			return err
		}
		var what string
		if res.AccountJWTs[t.pub], what, err = kr.keep(t.file+".jwt", func() (string, error) { return tc.Encode(okp) }, sameAccount(tc)); err != nil {
			return err
		}
		if t.crossings == nil && what != "unchanged" {
			what = "removed" // a removed team's or client's account, issued to revoke its users
		}
		res.Changes = append(res.Changes, Change{User: "account " + tc.Name, Account: true, What: what})
	}
	return nil
}
