package natsjwt_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

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
	} {
		err := c.g.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// A team's executor permissions are the template plus the subjects of its tools only.
func TestTeamPermissions(t *testing.T) {
	perms, err := natsjwt.ReadPermissions(filepath.Join("..", "permissions.conf"))
	if err != nil {
		t.Fatal(err)
	}
	p := natsjwt.TeamPermissions(perms[natsjwt.TeamTemplate], "TOOLBUS", []string{"calc"})
	for _, want := range []string{"$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_calc", "$JS.ACK.TOOLBUS.tool_calc.>", "$KV.toolbus_tools.calc",
		"$KV.toolbus_claims.calc.>", "$KV.toolbus_outputs.calc.>", "toolbus.*.tool.finished.calc", "toolbus.*.tool.waiting.calc",
		"$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.tool__unknown", "toolbus.*.tool.finished._unknown"} {
		if !slices.Contains(p.PubAllow, want) {
			t.Errorf("team permissions lack %s", want)
		}
	}
	for _, s := range p.PubAllow {
		if strings.Contains(s, ".>") && (strings.HasPrefix(s, "$KV.toolbus_tools") || strings.HasPrefix(s, "toolbus.*.tool.")) ||
			s == "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.*" || s == "$KV.toolbus_claims.>" || s == "$KV.toolbus_outputs.>" {
			t.Errorf("team permissions allow %s: more than its tools", s)
		}
	}
}
