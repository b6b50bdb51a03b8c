package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// gen runs from any directory and writes its secrets outside the repository by default:
// the permissions come from this checkout, the files go to toolbus/nats under the user's
// configuration directory (created 0700), and nothing is written where it runs.
func TestGenDefaultsFromAnyDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("generates keys")
	}
	cwd, config := t.TempDir(), t.TempDir()
	t.Chdir(cwd)
	t.Setenv("XDG_CONFIG_HOME", config)
	t.Setenv("HOME", t.TempDir())
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 0 {
		t.Fatalf("gen: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	dir := filepath.Join(config, "toolbus", "nats")
	for _, f := range []string{"auth-jwt.conf", "auth-users.conf", "admin.creds", "k8s-secrets.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the output directory: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	if !strings.Contains(out.String(), "wrote the credentials (secrets) to "+dir) {
		t.Errorf("gen does not say where the secrets are:\n%s", out.String())
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Errorf("gen wrote into the directory it ran from: %v", entries)
	}

	// A missing permissions file is named, with the flag that gives one.
	out.Reset()
	errOut.Reset()
	if code := run([]string{"-perms", filepath.Join(cwd, "nope.conf"), "-out", t.TempDir()}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "nope.conf") {
		t.Fatalf("gen with a missing -perms: exit %d, %s", code, errOut.String())
	}
}

// gen -accounts issues the accounts layout and prints, for each team's executors, the
// settings they need, the API prefix among them, and which accounts it changed.
func TestGenAccounts(t *testing.T) {
	if testing.Short() {
		t.Skip("generates keys")
	}
	dir := t.TempDir()
	grants := filepath.Join(dir, "grants.json")
	if err := os.WriteFile(grants, []byte(`{"teams": {"alpha": ["calc"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"-accounts", "-grants", grants, "-out", filepath.Join(dir, "out")}, &out, &errOut); code != 0 {
		t.Fatalf("gen: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"TOOLBUS_TEAM=alpha TOOLBUS_EXECUTOR_TOOLS=calc TOOLBUS_NATS_API_PREFIX=JS.core.API",
		"new       account of team alpha", "new       account TOOLBUS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("gen -accounts does not print %q:\n%s", want, out.String())
		}
	}
	conf, err := os.ReadFile(filepath.Join(dir, "out", "auth-users.conf"))
	if err != nil || !strings.Contains(string(conf), `"TEAM_alpha" {`) {
		t.Errorf("auth-users.conf has no account of alpha's: %v\n%s", err, conf)
	}
	if !strings.Contains(string(conf), "limits {max_connections: 100, max_subscriptions: 2000, max_leafnodes: 0, max_payload: 1048576}") {
		t.Errorf("auth-users.conf does not limit alpha's account by the defaults:\n%s", conf)
	}
	if conf, err := os.ReadFile(filepath.Join(dir, "out", "auth-jwt.conf")); err != nil || !strings.Contains(string(conf), "\nresolver: MEMORY\n") {
		t.Errorf("auth-jwt.conf without -resolver-dir has no memory resolver: %v\n%s", err, conf)
	}
	// -resolver-dir: a full resolver, and what each change needs says to push; the
	// -tenant-* flags limit the tenants' accounts.
	out.Reset()
	jwtDir := filepath.Join(dir, "jwt")
	if code := run([]string{"-accounts", "-grants", grants, "-resolver-dir", jwtDir, "-tenant-conns", "5", "-tenant-subs", "-1", "-tenant-leafnodes", "2", "-out", filepath.Join(dir, "full")}, &out, &errOut); code != 0 {
		t.Fatalf("gen -resolver-dir: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "new       account of team alpha: push it (system.creds: toolbus admin push") {
		t.Errorf("gen -resolver-dir does not say to push:\n%s", out.String())
	}
	if conf, err := os.ReadFile(filepath.Join(dir, "full", "auth-jwt.conf")); err != nil || !strings.Contains(string(conf), "type: full\n  dir: \""+jwtDir+"\"") {
		t.Errorf("auth-jwt.conf with -resolver-dir has no full resolver in %s: %v\n%s", jwtDir, err, conf)
	}
	if conf, err := os.ReadFile(filepath.Join(dir, "full", "auth-nkeys.conf")); err != nil || !strings.Contains(string(conf), "limits {max_connections: 5, max_subscriptions: -1, max_leafnodes: 2, max_payload: 1048576}") {
		t.Errorf("auth-nkeys.conf does not limit alpha's account by the -tenant-* flags: %v\n%s", err, conf)
	}
}
