package admin

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
)

func init() { bcryptCost = bcrypt.MinCost }

// admin runs toolbus admin in-process: exit code, stdout, stderr.
func admin(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), args, "", &out, &errOut)
	return code, out.String(), errOut.String()
}

// files reads every file of dir (its permissions subdirectory too), but the server's
// own: its full resolver's directory (ResolverSubdir), where it stores what it is pushed.
func files(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && p == filepath.Join(dir, ResolverSubdir) {
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diff names the files added, changed or removed from before to after.
func diff(before, after map[string][]byte) []string {
	var out []string
	for name, b := range after {
		if a, ok := before[name]; !ok || !bytes.Equal(a, b) {
			out = append(out, name)
		}
	}
	for name := range before {
		if _, ok := after[name]; !ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return withoutSigning(out)
}

// withoutSigning leaves out of changed files the keyring (signers.json, changed by every
// edit: TestIssueSigningKeys checks it) and the signing key of a user whose credentials
// changed too (a new or rotated user gets a new key with them); any other key changed
// stays, for the caller to refuse.
func withoutSigning(changed []string) []string {
	all := slices.Clone(changed)
	return slices.DeleteFunc(changed, func(f string) bool {
		user, isKey := strings.CutSuffix(f, ".sign")
		return f == KeyringFile || isKey && slices.Contains(all, user+".creds")
	})
}

// copyDir copies the files of a deployment into a new directory.
func copyDir(t *testing.T, fs map[string][]byte) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "d")
	for name, b := range fs {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// configs are the files every edit may rewrite: the grants and the server configs,
// which list every tenant (in operator mode the memory resolver's preload).
var configs = []string{GrantsFile, "auth-jwt.conf", "auth-nkeys.conf", "auth-users.conf", "k8s-secrets.yaml"}

// Each subcommand changes only its tenant's files: the table's files, beside the
// configs; every other file of the deployment (the keys, every other user's
// credentials, every other team's account) stays byte for byte. A revocation (a removed
// or rotated user) goes into the JWT of the account that issued the user: in the
// accounts layout a team's own (a pushed core account would drop every other team's
// pulls in flight), in one account the one.
func TestSubcommandsTouchOnlyTheirTenant(t *testing.T) {
	for _, layout := range []struct {
		name string
		init []string
	}{{"accounts", nil}, {"accounts, memory resolver", []string{"-memory-resolver"}}, {"one account", []string{"-one-account"}}} {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "base")
			for _, args := range [][]string{
				append([]string{"init", "-dir", dir}, layout.init...),
				{"add-team", "-dir", dir, "alpha", "calc"},
				{"add-team", "beta", "search", "-dir", dir},
				{"add-client", "-dir", dir, "alice", "alice"},
			} {
				if code, out, errOut := admin(t, args...); code != 0 {
					t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
				}
			}
			accounts, full := !slices.Contains(layout.init, "-one-account"), layout.init == nil
			base := files(t, dir)
			revoked := []string{"account.jwt", "revocations.json"}
			// One secret file per user: init issues the JWT kind alone unless -auth.
			user := func(u string) []string { return []string{u + ".creds"} }
			for _, tc := range []struct {
				args           []string
				want, wantJWT  []string // the files it changes besides the configs (wantJWT: the accounts layout's)
				wantOne        []string // and in one account's
				wantOut        []string
				wantOutAccount []string
				wantOutMemory  []string // and with its memory resolver
				wantOutFull    []string // and with its full resolver
			}{
				{args: []string{"add-team", "gamma", "web"}, want: user("executor-gamma"), wantJWT: []string{"team-gamma.jwt", "team-gamma.nk"},
					wantOut: []string{"new       executor-gamma: hand out its files", "TOOLBUS_TEAM=gamma TOOLBUS_EXECUTOR_TOOLS=web",
						"next: create the queues of gamma's new tools (admin's credentials; its executors refuse to start until then): toolbus init --tools web\n"},
					wantOutMemory: []string{"new       account of team gamma: reload the server"},
					wantOutFull:   []string{"new       account of team gamma: push it (system.creds: toolbus admin push"}},
				{args: []string{"grant", "alpha", "calc2"}, wantOne: user("executor-alpha")[:1], wantJWT: []string{"team-alpha.jwt"},
					wantOut: []string{"unchanged (files byte for byte as they were): admin, planner, ",
						"next: create the queues of alpha's new tools (admin's credentials; its executors refuse to start until then): toolbus init --tools calc2\n"},
					wantOutAccount: []string{"unchanged (files byte for byte as they were): admin, planner, injector, executor-alpha, executor-beta, client-alice"},
					wantOutMemory:  []string{"changed   account of team alpha: reload the server (kill -HUP)", "toolbus admin push"},
					wantOutFull:    []string{"changed   account of team alpha: push it (system.creds: toolbus admin push, natsjwt.PushAccounts): the full resolver takes a changed account from a push, not from a reload"}},
				// A team named team-a: its account (team-team-a) is printed by whose it is.
				{args: []string{"add-team", "team-a"}, want: user("executor-team-a"), wantJWT: []string{"team-team-a.jwt", "team-team-a.nk"},
					wantOut:       []string{"next: grant it tools (toolbus admin grant team-a TOOL...), then create their queues: toolbus init --tools TOOL,...\n"},
					wantOutMemory: []string{"new       account of team team-a: reload the server"},
					wantOutFull:   []string{"new       account of team team-a: push it"}},
				{args: []string{"revoke", "alpha", "calc"}, wantOne: append(user("executor-alpha")[:1], revoked...), wantJWT: []string{"team-alpha.jwt"}},
				// A removed team's account stays, with no import and its user revoked.
				{args: []string{"remove-team", "beta"}, want: user("executor-beta"), wantOne: revoked, wantJWT: []string{"team-beta.jwt"},
					wantOut:        []string{"removed   executor-beta: its files are deleted"},
					wantOutAccount: []string{"removed   account of team beta: kept with no import and its users revoked"}},
				{args: []string{"add-client", "bob", "bob", "bob-bot"}, want: user("client-bob"), wantJWT: []string{"account-client-bob.jwt", "account-client-bob.nk"},
					wantOut:        []string{"new       client-bob: hand out its files"},
					wantOutAccount: []string{"it runs with TOOLBUS_NATS_READ_PREFIX=toolbus_read.bob.API", natsjwt.ReadPrefixNote},
					wantOutMemory:  []string{"new       account of client bob: reload the server"},
					wantOutFull:    []string{"new       account of client bob: push it (system.creds: toolbus admin push"}},
				// A client's revocation goes into its own account's JWT, which stays, with no import.
				{args: []string{"remove-client", "alice"}, want: user("client-alice"), wantOne: revoked, wantJWT: []string{"account-client-alice.jwt"},
					wantOutAccount: []string{"removed   account of client alice: kept with no import and its users revoked"}},
				{args: []string{"rotate", "client-alice"}, want: user("client-alice"), wantOne: revoked, wantJWT: []string{"account-client-alice.jwt"},
					wantOut: []string{"rotated   client-alice: hand out its new files"}, wantOutAccount: []string{"changed   account of client alice"}},
				{args: []string{"rotate", "executor-beta"}, want: user("executor-beta"), wantOne: revoked, wantJWT: []string{"team-beta.jwt"},
					wantOut: []string{"rotated   executor-beta: hand out its new files", "hand to the holders of executor-beta:"}, wantOutAccount: []string{"changed   account of team beta"}},
				// A core user's revocation goes into the core's JWT (and, as before, every team's).
				{args: []string{"rotate", "planner"}, want: append(user("planner"), revoked...), wantJWT: []string{"team-alpha.jwt", "team-beta.jwt"}},
			} {
				t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
					t.Parallel()
					d := copyDir(t, base)
					code, out, errOut := admin(t, append(tc.args, "-dir", d)...)
					if code != 0 {
						t.Fatalf("exit %d\n%s%s", code, out, errOut)
					}
					want := slices.Clone(tc.want)
					wantOut := slices.Clone(tc.wantOut)
					switch {
					case full:
						want = append(want, tc.wantJWT...)
						wantOut = append(append(wantOut, tc.wantOutAccount...), tc.wantOutFull...)
					case accounts:
						want = append(want, tc.wantJWT...)
						wantOut = append(append(wantOut, tc.wantOutAccount...), tc.wantOutMemory...)
					default:
						want = append(want, tc.wantOne...) // a team's user JWT carries its tools
					}
					got := slices.DeleteFunc(diff(base, files(t, d)), func(f string) bool { return slices.Contains(configs, f) })
					want = slices.Compact(slices.Sorted(slices.Values(want)))
					if !slices.Equal(got, want) {
						t.Errorf("changed files %v, want %v\n%s", got, want, out)
					}
					for _, w := range wantOut {
						if !strings.Contains(out, w) {
							t.Errorf("the output does not say %q:\n%s", w, out)
						}
					}
					if strings.Contains(out, "account team-") || strings.Contains(out, "account client-") {
						t.Errorf("the output names a tenant's account by its name, not by whose it is:\n%s", out)
					}
					// Issued again with no edit, nothing changes at all.
					after := files(t, d)
					if code, out, errOut := admin(t, "push", "-dir", d, "-server", "nats://127.0.0.1:1"); code != 1 || !strings.Contains(out+errOut, "the files are written, the push failed") {
						if accounts || !strings.Contains(errOut, "only the accounts layout issues") {
							t.Errorf("push with no server: exit %d\n%s%s", code, out, errOut)
						}
					}
					if changed := diff(after, files(t, d)); len(changed) > 0 {
						t.Errorf("a push with no edit changed %v", changed)
					}
				})
			}
		})
	}
}

// A refusal says why and changes no file; a usage error exits 2.
func TestRefusals(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	for _, args := range [][]string{{"init", "-dir", dir}, {"add-team", "-dir", dir, "alpha", "calc"}, {"add-client", "-dir", dir, "alice", "alice"}} {
		code, out, errOut := admin(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		// The accounts layout's init says that the tenants' writes are bounded by default.
		if args[0] == "init" && !strings.Contains(out, "TOOLBUS_TENANT_BYTES_PER_SECOND (default 1048576") {
			t.Errorf("init does not say how the tenants' writes are bounded:\n%s", out)
		}
	}
	before := files(t, dir)
	empty := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"init"}, 1, "holds a deployment already (grants.json): init makes one once"},
		{[]string{"add-team", "alpha"}, 1, "refused: team alpha exists: grant it tools with toolbus admin grant alpha TOOL..."},
		{[]string{"add-team", "beta", "calc"}, 1, "refused: tool calc is owned by team alpha: a tool has one owner (toolbus admin revoke alpha calc first)"},
		{[]string{"add-team", "Beta!"}, 1, `refused: invalid team name "Beta!"`},
		{[]string{"grant", "gamma", "web"}, 1, "refused: no team gamma (teams: alpha); add it: toolbus admin add-team gamma TOOL..."},
		{[]string{"grant", "alpha", "calc"}, 1, "refused: team alpha has tool calc already"},
		{[]string{"grant", "alpha", "bad tool"}, 1, `refused: team alpha: invalid tool name "bad tool"`},
		{[]string{"revoke", "alpha", "web"}, 1, "refused: team alpha has no tool web (its tools: calc)"},
		{[]string{"remove-team", "gamma"}, 1, "refused: no team gamma (teams: alpha)"},
		{[]string{"add-client", "alice", "bob"}, 1, "refused: client alice exists (alice): remove it first"},
		{[]string{"add-client", "bob", "_none"}, 1, `refused: client bob: invalid identity "_none"`},
		{[]string{"remove-client", "bob"}, 1, "refused: no client bob (clients: alice)"},
		{[]string{"rotate", "nobody"}, 1, "refused: no user nobody (users: admin, planner, injector, executor-alpha, client-alice)"},
		{[]string{"rotate", "client"}, 1, "refused: no user client (users: admin, planner, injector, executor-alpha, client-alice)"},
		{[]string{"init", "-one-account", "-core-wide", "-dir", empty}, 2, "-core-wide is the accounts layout's"},
		{[]string{"grant", "alpha", "web", "-push"}, 1, "-push needs the server: set TOOLBUS_NATS_URL or give -server URL"},
		{[]string{"grant", "alpha"}, 2, "usage: toolbus admin grant TEAM TOOL... (got 1 arguments)"},
		{[]string{"remove-team", "alpha", "beta"}, 2, "usage: toolbus admin remove-team TEAM (got 2 arguments)"},
		{[]string{"grant", "-nope", "alpha", "web"}, 2, "flag provided but not defined: -nope"},
		{[]string{"frobnicate"}, 2, `unknown subcommand "frobnicate"`},
		{[]string{"grant", "alpha", "web", "-dir", empty}, 1, "holds no deployment of toolbus admin (no deployment.json): create one with toolbus admin init -dir " + empty},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := tc.args
			if !slices.Contains(args, "-dir") && args[0] != "frobnicate" {
				args = append(slices.Clone(args), "-dir", dir)
			}
			code, out, errOut := admin(t, args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, want %d; stderr does not say %q:\n%s%s", code, tc.code, tc.want, out, errOut)
			}
			if changed := diff(before, files(t, dir)); len(changed) > 0 {
				t.Errorf("a refusal changed %v", changed)
			}
		})
	}
	// The grant that was refused for want of a server wrote nothing: it goes through once.
	if code, out, errOut := admin(t, "grant", "alpha", "web", "-dir", dir); code != 0 || !strings.Contains(out, "account of team alpha") {
		t.Fatalf("grant alpha web: exit %d\n%s%s", code, out, errOut)
	}
	if g := files(t, dir)[GrantsFile]; !strings.Contains(string(g), `"web"`) {
		t.Fatalf("grants.json:\n%s", g)
	}
}

// In the accounts layout init issues no core-wide credentials (the core's shared
// executor and client, natsjwt.CoreWide) unless asked with -core-wide, and says so;
// asked, it says what each can do. An edit keeps either choice (deployment.json), and
// the one-account layout has them always.
func TestInitCoreWideOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		name     string
		init     []string
		issued   bool
		wantOut  string
		wantNote bool
	}{
		{"accounts", nil, false, "no core-wide executor or client credentials", false},
		{"accounts -core-wide", []string{"-core-wide"}, true, "core-wide: starts, decides, cancels and reads every run in anyone's name", true},
		{"one account", []string{"-one-account"}, true, "client.creds", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "d")
			code, out, errOut := admin(t, append([]string{"init", "-dir", dir, "-auth", "all"}, tc.init...)...)
			if code != 0 || !strings.Contains(out, tc.wantOut) {
				t.Fatalf("init %v: exit %d, does not say %q:\n%s%s", tc.init, code, tc.wantOut, out, errOut)
			}
			if got := strings.Contains(out, "core-wide: serves every team's tools"); got != tc.wantNote {
				t.Errorf("init %v says what the core's executor can do: %v, want %v:\n%s", tc.init, got, tc.wantNote, out)
			}
			if code, out, errOut := admin(t, "add-team", "-dir", dir, "alpha", "calc"); code != 0 {
				t.Fatalf("add-team: exit %d\n%s%s", code, out, errOut)
			}
			for _, u := range natsjwt.CoreWide {
				for _, ext := range []string{".creds", ".nk", ".password"} {
					_, err := os.Stat(filepath.Join(dir, u+ext))
					if issued := err == nil; issued != tc.issued {
						t.Errorf("%s%s issued: %v, want %v", u, ext, issued, tc.issued)
					}
				}
			}
			users, err := os.ReadFile(filepath.Join(dir, "auth-users.conf"))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(users), `user: "client"`) || strings.Contains(string(users), "user: client,"); got != tc.issued {
				t.Errorf("auth-users.conf has the user client: %v, want %v", got, tc.issued)
			}
		})
	}
}

// -h lists every subcommand and flag on stdout; the subcommands' own -h their flags.
func TestHelp(t *testing.T) {
	code, out, errOut := admin(t, "-h")
	if code != 0 || errOut != "" {
		t.Fatalf("-h: exit %d\n%s", code, errOut)
	}
	for _, w := range append([]string{"usage: toolbus admin", "init [-one-account]", "-push", "-server", "-dir", "-listen", "-store", "-accounts"},
		slices.Collect(maps.Keys(editNames()))...) {
		if !strings.Contains(out, w) {
			t.Errorf("-h does not list %q:\n%s", w, out)
		}
	}
	if code, _, errOut := admin(t); code != 2 || !strings.Contains(errOut, "usage: toolbus admin") {
		t.Errorf("no subcommand: exit %d\n%s", code, errOut)
	}
}

func editNames() map[string]bool {
	out := map[string]bool{}
	for _, e := range edits {
		out["  "+e.name+" "] = true
	}
	return out
}
