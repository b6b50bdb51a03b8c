package admin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// secretFiles are the per-user secret files of dir (.creds, .password, .nk) of user.
func secretFiles(t *testing.T, dir, user string) []string {
	t.Helper()
	var out []string
	for _, ext := range []string{".creds", ".password", ".nk"} {
		if _, err := os.Stat(filepath.Join(dir, user+ext)); err == nil {
			out = append(out, user+ext)
		}
	}
	return out
}

// A tenant gets one secret file, its .creds, unless init -auth asks for more kinds
// (deployment.json keeps the choice, so every edit issues the same kinds); rotate,
// remove-team and remove-client handle the one file (a removed tenant's .creds goes,
// found without a .password beside it), and the output hands out only what exists. A
// list of kinds without jwt is refused before anything is written.
func TestOneSecretFilePerTenant(t *testing.T) {
	for _, tc := range []struct {
		auth    []string
		want    []string // executor-alpha's files
		configs []string // the server configs written
	}{
		{nil, []string{".creds"}, []string{"auth-jwt.conf"}},
		{[]string{"-auth", "jwt,users"}, []string{".creds", ".password"}, []string{"auth-jwt.conf", "auth-users.conf", "k8s-secrets.yaml"}},
		{[]string{"-auth", "all"}, []string{".creds", ".password", ".nk"}, []string{"auth-jwt.conf", "auth-users.conf", "k8s-secrets.yaml", "auth-nkeys.conf"}},
	} {
		t.Run(strings.Join(tc.auth, " "), func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "d")
			run := func(args ...string) string {
				t.Helper()
				code, out, errOut := admin(t, append(args, "-dir", dir)...)
				if code != 0 {
					t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
				}
				return out
			}
			run(append([]string{"init"}, tc.auth...)...)
			out := run("add-team", "alpha", "calc")
			run("add-client", "alice", "alice")
			var want []string
			for _, ext := range tc.want {
				want = append(want, "executor-alpha"+ext)
			}
			for _, u := range []string{"executor-alpha", "admin", "injector"} {
				got := secretFiles(t, dir, u)
				if len(got) != len(tc.want) {
					t.Errorf("%s has %v, want one file per kind %v", u, got, tc.want)
				}
			}
			if got := secretFiles(t, dir, "executor-alpha"); !slices.Equal(got, want) {
				t.Errorf("executor-alpha's files %v, want %v", got, want)
			}
			// The hand-out line names the files that exist, nothing more.
			line := out[strings.Index(out, "hand to the holders of executor-alpha:"):]
			line = strings.Split(line, "\n")[1]
			if strings.Count(line, filepath.Join(dir, "executor-alpha")) != len(tc.want) {
				t.Errorf("add-team hands out %q, want the %d files %v", line, len(tc.want), tc.want)
			}
			for _, f := range []string{"auth-jwt.conf", "auth-users.conf", "k8s-secrets.yaml", "auth-nkeys.conf"} {
				_, err := os.Stat(filepath.Join(dir, f))
				if exists := err == nil; exists != slices.Contains(tc.configs, f) {
					t.Errorf("%s written: %v, want %v", f, exists, !exists)
				}
			}
			old, err := os.ReadFile(filepath.Join(dir, "executor-alpha.creds"))
			if err != nil {
				t.Fatal(err)
			}
			if out := run("rotate", "executor-alpha"); !strings.Contains(out, "rotated   executor-alpha") {
				t.Errorf("rotate does not say it rotated:\n%s", out)
			}
			if now, _ := os.ReadFile(filepath.Join(dir, "executor-alpha.creds")); string(now) == string(old) {
				t.Error("rotate kept executor-alpha.creds")
			}
			if got := secretFiles(t, dir, "executor-alpha"); !slices.Equal(got, want) {
				t.Errorf("after rotate executor-alpha's files %v, want %v", got, want)
			}
			// Control: alice's files are there before her removal.
			if len(secretFiles(t, dir, "client-alice")) != len(tc.want) {
				t.Fatalf("client-alice has %v before remove-client", secretFiles(t, dir, "client-alice"))
			}
			for _, rm := range [][]string{{"remove-team", "alpha"}, {"remove-client", "alice"}} {
				if out := run(rm...); !strings.Contains(out, "removed") {
					t.Errorf("%v does not say removed:\n%s", rm, out)
				}
			}
			for _, u := range []string{"executor-alpha", "client-alice"} {
				if got := secretFiles(t, dir, u); len(got) > 0 {
					t.Errorf("%s removed, its files %v are left", u, got)
				}
			}
			if len(secretFiles(t, dir, "admin")) != len(tc.want) {
				t.Errorf("admin's files are gone with the tenants: %v", secretFiles(t, dir, "admin"))
			}
		})
	}
	for _, auth := range []string{"users", "nkeys,users", "ldap"} {
		dir := filepath.Join(t.TempDir(), "d")
		code, _, errOut := admin(t, "init", "-dir", dir, "-auth", auth)
		if code != 2 || !strings.Contains(errOut, "-auth") {
			t.Errorf("init -auth %s: exit %d, want a usage error naming -auth: %s", auth, code, errOut)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("init -auth %s wrote %s", auth, dir)
		}
	}
}
