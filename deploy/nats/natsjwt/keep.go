package natsjwt

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
)

// Change is what one run of GenerateGrants did to a user's credentials, so that an
// administrator knows whom to hand what: a run that adds a team or grants a tool
// touches only that tenant's credentials.
type Change struct {
	// User is the user's name, or in the accounts layout an account's
	// ("account TOOLBUS", "account team-<team>", "account client-<name>": Account is set).
	User    string
	Account bool
	// What: "new" (first issued), "changed" (its permissions changed: hand out the new
	// files, reload the server for users and nkeys), "unchanged" (its files are as they
	// were) or "removed" (its files deleted; in operator mode its JWT is revoked; a
	// removed client's account is issued once more, with no import and its users revoked).
	What string
}

// rotate forgets the kept credentials of the users named, revoking their JWTs, so that
// this run issues new ones; a name that is not a user of this run is an error.
func (k keyring) rotate(users []User, names []string, revoked revocations) error {
	for _, name := range names {
		if !slices.ContainsFunc(users, func(u User) bool { return u.Name == name }) {
			return fmt.Errorf("natsjwt: rotate %q: not a user of these grants", name)
		}
		if uc, ok := k.userJWT(name); ok {
			revoked.revoke(uc)
		}
		for _, ext := range []string{".password", ".nk", ".creds"} {
			if err := os.Remove(filepath.Join(k.dir, name+ext)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("natsjwt: %w", err)
			}
		}
	}
	return nil
}

// keyring keeps the secrets of a deployment in its output directory: the operator's,
// the system account's and the toolbus account's seeds, and each user's password and
// nkey seed. A second run of GenerateGrants on the same directory reuses them, so the
// account keeps its identity (JetStream stores its streams under the account's public
// key: a new account would hide the audit trail) and every user keeps its credentials.
type keyring struct {
	dir string
}

// seed returns the key pair kept in file, creating and keeping a new one with create
// when the file does not exist.
func (k keyring) seed(file string, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, error) {
	p := filepath.Join(k.dir, file)
	b, err := os.ReadFile(p)
	switch {
	case err == nil:
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			return nil, fmt.Errorf("natsjwt: %s: %w", p, err)
		}
		return kp, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("natsjwt: %w", err)
	}
	kp, err := create()
	if err != nil {
		return nil, fmt.Errorf("natsjwt: %w", err)
	}
	s, _ := kp.Seed()
	if err := os.WriteFile(p, s, 0o600); err != nil {
		return nil, fmt.Errorf("natsjwt: %w", err)
	}
	return kp, nil
}

// password returns the password kept for user, or a new random one (not yet kept: the
// caller writes it with the rest of the user's files).
func (k keyring) password(user string) (string, error) {
	if b, err := os.ReadFile(filepath.Join(k.dir, user+".password")); err == nil && len(b) > 0 {
		return string(b), nil
	}
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("natsjwt: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// userJWT returns the claims of the JWT in user's kept credentials file, if any.
func (k keyring) userJWT(user string) (*jwt.UserClaims, bool) {
	b, err := os.ReadFile(filepath.Join(k.dir, user+".creds"))
	if err != nil {
		return nil, false
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return nil, false
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return nil, false
	}
	return uc, true
}

// samePermissions reports whether uc carries exactly p.
func samePermissions(uc *jwt.UserClaims, p Permissions) bool {
	eq := func(a jwt.StringList, b []string) bool {
		return slices.Equal([]string(a), b) || (len(a) == 0 && len(b) == 0)
	}
	return eq(uc.Pub.Allow, p.PubAllow) && eq(uc.Pub.Deny, p.PubDeny) && eq(uc.Sub.Allow, p.SubAllow) && eq(uc.Sub.Deny, p.SubDeny) &&
		(uc.Resp != nil) == p.Responses
}

// revocationsFile keeps the user keys revoked in operator mode (removed or rotated users)
// that the core account issued, which the core's and every team's account JWT carry
// (revocations: a key a team's or client's account issued is revoked in that account's
// JWT only).
const revocationsFile = "revocations.json"

// removed deletes the files of the users kept in the directory that are not in users,
// revoking their JWTs, and returns their changes.
func (k keyring) removed(users []User, revoked revocations) ([]Change, error) {
	keep := map[string]bool{}
	for _, u := range users {
		keep[u.Name] = true
	}
	// A user's files: its .password and .nk when those kinds are issued, its .creds
	// always (system.creds is the system account's push user, no user of the grants).
	var names []string
	for _, ext := range []string{".password", ".creds"} {
		files, err := filepath.Glob(filepath.Join(k.dir, "*"+ext))
		if err != nil {
			return nil, fmt.Errorf("natsjwt: %w", err)
		}
		for _, f := range files {
			if name := strings.TrimSuffix(filepath.Base(f), ext); name != SystemUser && !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	sort.Strings(names)
	var out []Change
	all := false // a key of revoked.all was revoked
	for _, name := range names {
		if keep[name] {
			continue
		}
		if uc, ok := k.userJWT(name); ok && revoked.revoke(uc) {
			all = true
		}
		for _, ext := range []string{".password", ".nk", ".creds"} {
			if err := os.Remove(filepath.Join(k.dir, name+ext)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("natsjwt: %w", err)
			}
		}
		out = append(out, Change{User: name, What: "removed"})
	}
	if all {
		b, _ := json.MarshalIndent(revoked.all, "", "  ")
		if err := os.WriteFile(filepath.Join(k.dir, revocationsFile), b, 0o600); err != nil {
			return nil, fmt.Errorf("natsjwt: %w", err)
		}
	}
	return out, nil
}

// kept returns the JWT kept in file while same says it still says what a fresh one
// would, else the fresh one from encode, kept for the next run. A JWT re-encoded gets a
// new issue time and id: the server refuses to reload a config whose operator JWT
// changed at all, so an unchanged operator, system account or account keeps its text.
func (k keyring) kept(file string, encode func() (string, error), same func(old string) bool) (string, error) {
	s, _, err := k.keep(file, encode, same)
	return s, err
}

// keep is kept, also saying what it did: "unchanged", "new" or "changed".
func (k keyring) keep(file string, encode func() (string, error), same func(old string) bool) (string, string, error) {
	p := filepath.Join(k.dir, file)
	what := "new"
	if b, err := os.ReadFile(p); err == nil {
		if same(strings.TrimSpace(string(b))) {
			return strings.TrimSpace(string(b)), "unchanged", nil
		}
		what = "changed"
	}
	s, err := encode()
	if err != nil {
		return "", "", fmt.Errorf("natsjwt: %s: %w", file, err)
	}
	if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("natsjwt: %w", err)
	}
	return s, what, nil
}

// sameOperator reports whether old is an operator JWT equal to oc in what it says.
func sameOperator(oc *jwt.OperatorClaims) func(string) bool {
	return func(old string) bool {
		c, err := jwt.DecodeOperatorClaims(old)
		return err == nil && c.Subject == oc.Subject && c.Name == oc.Name && c.SystemAccount == oc.SystemAccount
	}
}

// sameAccount reports whether old is an account JWT equal to ac in what it says: its
// name, JetStream limits and revocations.
func sameAccount(ac *jwt.AccountClaims) func(string) bool {
	// Encode sorts the exports and imports: compare them in that order.
	exports, imports := slices.Clone(ac.Exports), slices.Clone(ac.Imports)
	sort.Sort(exports)
	sort.Sort(imports)
	return func(old string) bool {
		c, err := jwt.DecodeAccountClaims(old)
		return err == nil && c.Subject == ac.Subject && c.Name == ac.Name &&
			c.Limits.JetStreamLimits == ac.Limits.JetStreamLimits && c.Limits.NatsLimits == ac.Limits.NatsLimits &&
			c.Limits.AccountLimits == ac.Limits.AccountLimits && maps.Equal(c.Revocations, ac.Revocations) &&
			slices.EqualFunc(c.Exports, exports, sameExport) && slices.EqualFunc(c.Imports, imports, sameImport)
	}
}

func sameExport(a, b *jwt.Export) bool {
	return a.Subject == b.Subject && a.Type == b.Type && a.TokenReq == b.TokenReq && a.ResponseType == b.ResponseType &&
		a.ResponseThreshold == b.ResponseThreshold
}

// sameImport compares what an import says; its activation token (issued anew each run)
// must only still be a valid one of the same account for the same subject.
func sameImport(a, b *jwt.Import) bool {
	if a.Subject != b.Subject || a.LocalSubject != b.LocalSubject || a.Type != b.Type || a.Account != b.Account || (a.Token == "") != (b.Token == "") {
		return false
	}
	if a.Token == "" {
		return true
	}
	act, err := jwt.DecodeActivationClaims(a.Token)
	return err == nil && act.Issuer == a.Account && act.ImportSubject == a.Subject && act.ImportType == a.Type && act.Expires == 0
}

// narrows reports whether p takes away anything the old JWT allows: an allow it had
// is gone, or a deny it lacked is new.
func narrows(old *jwt.UserClaims, p Permissions) bool {
	sub := func(a, b []string) bool { // a ⊆ b
		for _, x := range a {
			if !slices.Contains(b, x) {
				return false
			}
		}
		return true
	}
	return !sub(old.Pub.Allow, p.PubAllow) || !sub(old.Sub.Allow, p.SubAllow) ||
		!sub(p.PubDeny, old.Pub.Deny) || !sub(p.SubDeny, old.Sub.Deny)
}

// secretRE is a user's password and its hash in k8s-secrets.yaml (as writeConfigKinds
// writes them).
var secretRE = regexp.MustCompile(`(?m)^  user: "([^"]+)"\n  password: ("[^"]*")\n  bcrypt: "([^"]+)"$`)

// issued is a password and its hash as the last run wrote them together.
type issued struct{ password, hash string }

// hashes are the passwords and their hashes of the last run, by user (from
// k8s-secrets.yaml), so that a user whose password is kept keeps its hash: the users
// config and the secrets change only where a user does.
func (k keyring) hashes() map[string]issued {
	out := map[string]issued{}
	b, err := os.ReadFile(filepath.Join(k.dir, "k8s-secrets.yaml"))
	if err != nil {
		return out
	}
	for _, m := range secretRE.FindAllStringSubmatch(string(b), -1) {
		if pw, err := strconv.Unquote(m[2]); err == nil {
			out[m[1]] = issued{password: pw, hash: m[3]}
		}
	}
	return out
}

// keptHash is old's hash while it is a hash of pw at cost, else a new one. A hash that
// the last run wrote beside this very password is kept without hashing again: every
// day-two command issues every user, and a bcrypt comparison costs as much as a hash
// (with a hundred users, seconds per command).
func keptHash(old issued, pw string, cost int) ([]byte, error) {
	if c, err := bcrypt.Cost([]byte(old.hash)); err == nil && c == cost && subtle.ConstantTimeCompare([]byte(old.password), []byte(pw)) == 1 {
		return []byte(old.hash), nil
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(pw), cost)
	if err != nil {
		return nil, fmt.Errorf("natsjwt: %w", err)
	}
	return hash, nil
}
