package natsjwt_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
)

// Grants name each tool once, with valid team and tool names; the unknown-tool token
// cannot be granted (every team serves that queue).
func TestGrantsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		g    natsjwt.Grants
		want string
	}{
		{"ok", natsjwt.Grants{Teams: map[string][]string{"a": {"x", "y"}, "b": {"z"}}}, ""},
		{"a tool granted twice", natsjwt.Grants{Teams: map[string][]string{"a": {"x"}, "b": {"x"}}}, "two teams"},
		{"the unknown-tool queue", natsjwt.Grants{Teams: map[string][]string{"a": {"_unknown"}}}, "invalid tool"},
		{"a wildcard tool", natsjwt.Grants{Teams: map[string][]string{"a": {"*"}}}, "invalid tool"},
		{"a bad team name", natsjwt.Grants{Teams: map[string][]string{"A.b": {"x"}}}, "invalid team"},
		{"a bound client", natsjwt.Grants{Clients: map[string][]string{"helpdesk": {"alice", "bob"}}}, ""},
		{"a client without identity", natsjwt.Grants{Clients: map[string][]string{"a": nil}}, "no identity"},
		{"a wildcard identity", natsjwt.Grants{Clients: map[string][]string{"a": {"*"}}}, "invalid identity"},
		{"a multi-token identity", natsjwt.Grants{Clients: map[string][]string{"a": {"alice.bob"}}}, "invalid identity"},
		{"the none identity", natsjwt.Grants{Clients: map[string][]string{"a": {"_none"}}}, "invalid identity"},
		{"a bad client name", natsjwt.Grants{Clients: map[string][]string{"A b": {"alice"}}}, "invalid client"},
	} {
		err := c.g.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// A team's executor permissions are the template plus its own instance records and the
// subjects of its tools only.
func TestTeamPermissions(t *testing.T) {
	perms, err := natsjwt.ReadPermissions(filepath.Join("..", "permissions.conf"))
	if err != nil {
		t.Fatal(err)
	}
	p := natsjwt.TeamPermissions(perms[natsjwt.TeamTemplate], "TOOLBUS", "pay", []string{"calc"})
	for _, want := range []string{"$KV.toolbus_instances.pay.*.*", "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.tool_calc", "$JS.ACK.TOOLBUS_QUEUES.tool_calc.*.*.*.*.*", "$JS.ACK.*.*.TOOLBUS_QUEUES.tool_calc.*.*.*.*.>", "$KV.toolbus_tools.calc",
		"$KV.toolbus_claims.calc.>", "$KV.toolbus_outputs.calc.>", "toolbus.*.tool.finished.calc", "toolbus.*.tool.waiting.calc", "toolbus.*.tool.progress.calc"} {
		if !slices.Contains(p.PubAllow, want) {
			t.Errorf("team permissions lack %s", want)
		}
	}
	for _, s := range p.PubAllow {
		if strings.Contains(s, "_unknown") {
			// The planner answers the calls nobody serves: a subject every team shared
			// would let one team answer another team's calls.
			t.Errorf("team permissions allow %s: the unknown-tool queue or its results", s)
		}
		if strings.Contains(s, ".>") && (strings.HasPrefix(s, "$KV.toolbus_tools") || strings.HasPrefix(s, "toolbus.*.tool.")) ||
			s == "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.*" || s == "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.*" || s == "$KV.toolbus_claims.>" || s == "$KV.toolbus_outputs.>" ||
			strings.HasPrefix(s, "$KV.toolbus_instances.") && s != "$KV.toolbus_instances.pay.*.*" {
			t.Errorf("team permissions allow %s: more than its tools and its own instance records", s)
		}
	}
}

// The generator's Kubernetes Secrets are valid Secrets, one per role and team, in the
// shape deploy/k8s reads (user, password, bcrypt), carrying the same password as the
// user/password setup and a bcrypt hash of it.
func TestGenerateK8sSecrets(t *testing.T) {
	dir := t.TempDir()
	g := natsjwt.Grants{Teams: map[string][]string{"payments": {"refund"}}}
	res, err := natsjwt.GenerateGrants(filepath.Join("..", "permissions.conf"), dir, g, natsjwt.WithBcryptCost(bcrypt.MinCost))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(res.K8sSecrets)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]corev1.Secret{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" || !strings.Contains(doc, "kind: Secret") {
			continue
		}
		var s corev1.Secret
		if err := yaml.UnmarshalStrict([]byte(strings.TrimPrefix(doc, "---\n")), &s); err != nil {
			t.Fatalf("not a Secret: %v\n%s", err, doc)
		}
		got[s.Name] = s
	}
	for _, u := range []string{"admin", "planner", "executor", "injector", "client", natsjwt.TeamUser("payments")} {
		s, ok := got["toolbus-nats-"+u]
		if !ok {
			t.Errorf("no Secret for %s (have %d)", u, len(got))
			continue
		}
		pw, err := os.ReadFile(res.Passwords[u])
		if err != nil {
			t.Fatal(err)
		}
		if s.Namespace != "toolbus" || s.StringData["user"] != u || s.StringData["password"] != string(pw) {
			t.Errorf("Secret of %s: namespace %q user %q, password matches the file: %v", u, s.Namespace, s.StringData["user"], s.StringData["password"] == string(pw))
		}
		if err := bcrypt.CompareHashAndPassword([]byte(s.StringData["bcrypt"]), pw); err != nil {
			t.Errorf("Secret of %s: bcrypt is not the password's hash: %v", u, err)
		}
	}
}

// A bound client's permissions are the client role's with the identity-bearing subjects
// (run.started, run.cancel, approvals) allowed for its identities only.
func TestClientPermissions(t *testing.T) {
	perms, err := natsjwt.ReadPermissions(filepath.Join("..", "permissions.conf"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := natsjwt.ClientPermissions(perms["client"], []string{"alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"toolbus.*.run.started.alice", "toolbus.*.run.cancel.alice",
		"toolbus.*.approval.granted.alice", "toolbus.*.approval.denied.alice", "$JS.API.DIRECT.GET.TOOLBUS.>", "toolbus_fair.held.*.alice"} {
		if !slices.Contains(p.PubAllow, want) {
			t.Errorf("alice's permissions lack %s", want)
		}
	}
	for _, s := range p.PubAllow {
		if (strings.HasPrefix(s, "toolbus.") || strings.HasPrefix(s, "toolbus_fair.")) && !strings.HasSuffix(s, ".alice") {
			t.Errorf("alice's permissions allow %s: another identity", s)
		}
	}
	// The fair scheduler's two subjects (every tenant's, one identity's) become alice's one.
	if len(p.PubAllow) != len(perms["client"].PubAllow)-1 || !slices.Equal(p.PubDeny, perms["client"].PubDeny) {
		t.Errorf("alice's permissions are not the client's with the identities narrowed: %d allows, the client has %d", len(p.PubAllow), len(perms["client"].PubAllow))
	}
	if _, err := natsjwt.ClientPermissions(perms["planner"], []string{"alice"}); err == nil {
		t.Error("a template without the identity subjects was bound")
	}
}

// A user whose password is kept keeps its bcrypt hash: issued again, the users config
// and the secrets change only where a user does (a rotated user gets a new hash).
func TestPasswordHashesKept(t *testing.T) {
	dir := t.TempDir()
	perms := filepath.Join("..", "permissions.conf")
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}}}
	read := func(file string) string {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	gen := func(opts ...natsjwt.Option) {
		if _, err := natsjwt.GenerateGrants(perms, dir, g, append(opts, natsjwt.WithBcryptCost(bcrypt.MinCost))...); err != nil {
			t.Fatal(err)
		}
	}
	gen()
	users, secrets := read("auth-users.conf"), read("k8s-secrets.yaml")
	gen()
	if read("auth-users.conf") != users || read("k8s-secrets.yaml") != secrets {
		t.Fatal("issued again with the same grants, the users config or the secrets changed")
	}
	gen(natsjwt.WithRotate("planner"))
	after := read("auth-users.conf")
	for _, l := range strings.Split(users, "\n") {
		changed := !strings.Contains(after, l)
		if changed != strings.Contains(l, `user: "planner"`) {
			t.Errorf("after rotating planner, changed %v: %s", changed, l)
		}
	}
}
