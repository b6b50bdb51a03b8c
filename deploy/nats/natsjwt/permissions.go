package natsjwt

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/conf"
)

// Roles are the toolbus roles, as named in permissions.conf (upper case there).
var Roles = []string{"admin", "planner", "executor", "injector", "client"}

// Permissions of one role: the publish and subscribe allow and deny lists.
type Permissions struct {
	PubAllow, PubDeny, SubAllow, SubDeny []string
	// Responses lets the user publish once to the reply subject of each request it
	// receives, within two minutes (the server's allow_responses defaults): an answer
	// to the asker's inbox without leave to publish to every inbox.
	Responses bool
}

// TeamTemplate is the key, in the Permissions ReadPermissions returns, of the
// permissions every team executor user starts from: TEAM_EXECUTOR of
// team-executor.conf, next to permissions.conf. TeamPermissions adds its tools.
const TeamTemplate = "team_executor"

// ReadPermissions parses permissions.conf and returns the lists of every role, and the
// team executor template (team-executor.conf in the same directory) under TeamTemplate.
func ReadPermissions(file string) (map[string]Permissions, error) {
	out := map[string]Permissions{}
	if err := readPermissions(file, Roles, out); err != nil {
		return nil, err
	}
	if err := readPermissions(filepath.Join(filepath.Dir(file), "team-executor.conf"), []string{TeamTemplate}, out); err != nil {
		return nil, err
	}
	return out, nil
}

func readPermissions(file string, roles []string, out map[string]Permissions) error {
	m, err := conf.ParseFile(file)
	if err != nil {
		return fmt.Errorf("natsjwt: %s: %w", file, err)
	}
	for _, role := range roles {
		r, ok := m[strings.ToUpper(role)].(map[string]any)
		if !ok {
			return fmt.Errorf("natsjwt: %s: no %s permissions", file, strings.ToUpper(role))
		}
		var p Permissions
		p.PubAllow, p.PubDeny = lists(r["publish"])
		p.SubAllow, p.SubDeny = lists(r["subscribe"])
		p.Responses, _ = r["allow_responses"].(bool)
		if len(p.PubAllow) == 0 || len(p.SubAllow) == 0 {
			return fmt.Errorf("natsjwt: %s: %s has no publish or subscribe allow list", file, role)
		}
		out[role] = p
	}
	return nil
}

func lists(v any) (allow, deny []string) {
	m, _ := v.(map[string]any)
	return strs(m["allow"]), strs(m["deny"])
}

func strs(v any) []string {
	var out []string
	switch x := v.(type) {
	case string:
		out = append(out, x)
	case []any:
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// confPermissions renders p in the server configuration syntax.
func confPermissions(p Permissions) string {
	list := func(ss []string) string {
		q := make([]string, len(ss))
		for i, s := range ss {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	resp := ""
	if p.Responses {
		resp = ", allow_responses: true"
	}
	return fmt.Sprintf("{publish: {allow: %s, deny: %s}, subscribe: {allow: %s, deny: %s}%s}",
		list(p.PubAllow), list(p.PubDeny), list(p.SubAllow), list(p.SubDeny), resp)
}
