package connect

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Secrets lists the password, the token, the nkey seed and the JWT and seed of a
// credentials file, and none of the file's armour or prose.
func TestSecrets(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "user.creds")
	if err := os.WriteFile(creds, []byte("-----BEGIN NATS USER JWT-----\neyJhbGciOi.jwt.sig\n------END NATS USER JWT------\n\n************************* IMPORTANT *************************\nNKEY Seed printed below can be used to sign and prove identity.\n\n-----BEGIN USER NKEY SEED-----\nSUACSEEDVALUE\n------END USER NKEY SEED------\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seed, []byte("SUANKEYSEED\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := Options{Password: "pw", Token: "tok", Creds: creds, NKeySeed: seed}.Secrets()
	for _, want := range []string{"pw", "tok", "eyJhbGciOi.jwt.sig", "SUACSEEDVALUE", "SUANKEYSEED"} {
		if !slices.Contains(got, want) {
			t.Errorf("Secrets() = %q, missing %q", got, want)
		}
	}
	for _, s := range got {
		if len(s) > 0 && (s[0] == '-' || s[0] == '*' || slices.Contains([]byte(s), ' ')) {
			t.Errorf("Secrets() holds %q, not a credential", s)
		}
	}
	if got := (Options{Creds: filepath.Join(dir, "missing")}).Secrets(); len(got) != 2 {
		t.Errorf("an unreadable file adds %q", got[2:])
	}
}
