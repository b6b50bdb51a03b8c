package admin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
)

// init's tenant limits are kept in deployment.json and every later subcommand issues a
// tenant's account with them, in the JWT kind and the config kinds; the defaults
// (accounts.DefaultTenantLimits) unless told, and a limit below -1 is a usage error.
func TestInitTenantLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		conn  int64
		subs  int64
		pay   int64
		conf  string
	}{
		{"default", nil, 100, 2000, 1 << 20, "limits {max_connections: 100, max_subscriptions: 2000, max_leafnodes: 0, max_payload: 1048576}"},
		{"set", []string{"-tenant-conns", "7", "-tenant-subs", "-1", "-tenant-payload", "4096"}, 7, -1, 4096, "limits {max_connections: 7, max_subscriptions: -1, max_leafnodes: 0, max_payload: 4096}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			if code, _, errOut := admin(t, append([]string{"init", "-dir", dir, "-memory-resolver", "-auth", "all"}, tc.flags...)...); code != 0 {
				t.Fatalf("init: exit %d: %s", code, errOut)
			}
			if code, _, errOut := admin(t, "add-team", "-dir", dir, "alpha", "calc"); code != 0 {
				t.Fatalf("add-team: exit %d: %s", code, errOut)
			}
			b, err := os.ReadFile(filepath.Join(dir, "team-alpha.jwt"))
			if err != nil {
				t.Fatal(err)
			}
			ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			if ac.Limits.Conn != tc.conn || ac.Limits.Subs != tc.subs || ac.Limits.LeafNodeConn != 0 || ac.Limits.Payload != tc.pay {
				t.Errorf("team-alpha's JWT limits: conn %d subs %d leaf %d payload %d, want %d %d 0 %d", ac.Limits.Conn, ac.Limits.Subs, ac.Limits.LeafNodeConn, ac.Limits.Payload, tc.conn, tc.subs, tc.pay)
			}
			for _, f := range []string{"auth-users.conf", "auth-nkeys.conf"} {
				conf, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(conf), tc.conf) {
					t.Errorf("%s lacks %q", f, tc.conf)
				}
			}
		})
	}
	if code, _, errOut := admin(t, "init", "-dir", filepath.Join(t.TempDir(), "d"), "-tenant-conns", "-2"); code != 2 || !strings.Contains(errOut, "connections limit -2") {
		t.Errorf("init -tenant-conns -2: exit %d, %s; want a usage error naming it", code, errOut)
	}
}

// toolbus admin issue takes a change of tenant_limits in deployment.json into the users
// and nkeys configs with no server to push to (a deployment whose servers run only
// those configs reloads them next), and changes no user's files.
func TestIssueTakesEditedLimits(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if code, _, errOut := admin(t, "init", "-dir", dir, "-auth", "all"); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	if code, _, errOut := admin(t, "add-team", "-dir", dir, "alpha", "calc"); code != 0 {
		t.Fatalf("add-team: exit %d: %s", code, errOut)
	}
	path := filepath.Join(dir, "deployment.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(b), `"conns": 100`, `"conns": 7`, 1)
	if edited == string(b) {
		t.Fatalf("deployment.json has no \"conns\": 100 to edit:\n%s", b)
	}
	if err := os.WriteFile(path, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	before := files(t, dir)
	code, out, errOut := admin(t, "issue", "-dir", dir)
	if code != 0 {
		t.Fatalf("issue: exit %d: %s%s", code, out, errOut)
	}
	after := files(t, dir)
	for _, f := range []string{"auth-users.conf", "auth-nkeys.conf"} {
		if !strings.Contains(string(after[f]), "limits {max_connections: 7, max_subscriptions: 2000, max_leafnodes: 0, max_payload: 1048576}") {
			t.Errorf("%s after issue lacks the edited limit", f)
		}
	}
	for name := range before {
		if strings.HasSuffix(name, ".creds") || strings.HasSuffix(name, ".password") || strings.HasSuffix(name, ".nk") {
			if string(before[name]) != string(after[name]) {
				t.Errorf("issue changed %s", name)
			}
		}
	}
}
