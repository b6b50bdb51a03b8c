package admin

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events/seal"
)

// TestIssueSigningKeys: toolbus admin gives every user it issues a signing key beside
// its credentials, and the keyring records each public key with its grants: init the
// roles', add-team a team's with its tools, add-client a client's with its identities;
// rotate retires the user's key and issues another (the old one kept); revoke ends a
// tool's span; remove-team revokes the team's key (kept). Each key file is readable and
// names the keyring's current key of its signer.
func TestIssueSigningKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	run := func(args ...string) {
		t.Helper()
		if code, out, errOut := admin(t, append(args, "-dir", dir)...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	ring := func() seal.Keyring {
		t.Helper()
		r, err := seal.ReadKeyring(filepath.Join(dir, KeyringFile))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	current := func(user, signer string) seal.Key {
		t.Helper()
		kf, err := seal.ReadKeyFile(SigningKeyFile(dir, user))
		if err != nil {
			t.Fatal(err)
		}
		r := ring()
		i := r.Current(signer)
		if i < 0 || r.Keys[i].KeyID != kf.KeyID || kf.Signer != signer {
			t.Fatalf("%s's key file names %s of %s; the ring's current key of %s: %d", user, kf.KeyID, kf.Signer, signer, i)
		}
		return r.Keys[i]
	}
	run("init", "-one-account")
	run("add-team", "alpha", "calc", "web")
	run("add-client", "bob", "bob", "bob-bot")
	for user, signer := range map[string]string{"planner": "role.planner", "injector": "role.injector", "admin": "role.admin",
		"executor-alpha": "team.alpha", "client-bob": "client.bob"} {
		current(user, signer)
	}
	now := time.Now()
	alpha := current("executor-alpha", "team.alpha")
	if !seal.Granted(alpha.Tools, "calc", now) || !seal.Granted(alpha.Tools, "web", now) || seal.Granted(alpha.Tools, "search", now) {
		t.Fatalf("alpha's tools %v", alpha.Tools)
	}
	if bob := current("client-bob", "client.bob"); !seal.Granted(bob.Identities, "bob-bot", now) || seal.Granted(bob.Identities, "alice", now) {
		t.Fatalf("bob's identities %v", bob.Identities)
	}

	run("rotate", "executor-alpha")
	rotated := current("executor-alpha", "team.alpha")
	old, ok := ring().Lookup(alpha.KeyID)
	if rotated.KeyID == alpha.KeyID || !ok || old.Retired.IsZero() || old.ValidAt(old.Retired.Add(-time.Second)) != "" || old.ValidAt(time.Now()) == "" {
		t.Fatalf("after rotate: new %s, old %+v", rotated.KeyID, old)
	}

	mid := time.Now()
	run("revoke", "alpha", "web")
	later := time.Now().Add(time.Second)
	if k := current("executor-alpha", "team.alpha"); seal.Granted(k.Tools, "web", later) || !seal.Granted(k.Tools, "web", mid) || !seal.Granted(k.Tools, "calc", later) {
		t.Fatalf("after revoke: alpha's tools %v", k.Tools)
	}

	run("remove-team", "alpha")
	r := ring()
	i := slices.IndexFunc(r.Keys, func(k seal.Key) bool { return k.KeyID == rotated.KeyID })
	if i < 0 || r.Keys[i].Revoked.IsZero() || r.Current("team.alpha") >= 0 {
		t.Fatalf("after remove-team: %+v", r.Keys)
	}
	if n := len(slices.DeleteFunc(slices.Clone(r.Keys), func(k seal.Key) bool { return k.Signer != "team.alpha" })); n != 2 {
		t.Fatalf("team.alpha has %d keys in the ring, want 2 (the rotated one kept)", n)
	}
}
