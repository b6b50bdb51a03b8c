// Package admin is `toolbus admin`: a deployment's administration as commands. init
// creates a deployment once (its keys, every role's credentials, the server configs and
// an empty grants.json, kept in one directory); add-team, grant, revoke, remove-team,
// add-client, remove-client and rotate each edit the grants and issue again with the same
// keys (natsjwt.GenerateGrants), which touches only the tenant named (in the accounts
// layout a team's or client's own account); they print what
// changed and what to hand to whom, and with -push send the changed account JWTs to the
// running servers (natsjwt.PushAccounts) so that no process restarts and no server
// reloads: auth-jwt.conf's full resolver stores a new team's or client's account from
// the push too (a deployment made with init -memory-resolver needs a reload for a new
// account).
package admin

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
)

// ErrRefused is wrapped by an edit the grants do not allow (an unknown team, a tool
// another team owns, an unknown user...): nothing is written.
var ErrRefused = errors.New("refused")

// refused is an ErrRefused saying why.
func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// edit is a subcommand that changes the grants: its arguments, and what it does to g.
type edit struct {
	name, args, what string
	min              int  // arguments at least
	max              int  // at most; -1: any
	rotate           bool // the argument is a user to rotate, g is unchanged
	apply            func(g *natsjwt.Grants, args []string) error
	// next, when set, is the command that must run after the edit ("": none).
	next func(args []string) string
}

// edits are the subcommands that change a deployment, in the order -h lists them.
var edits = []edit{
	{name: "add-team", args: "TEAM [TOOL...]", what: "add a team (its own account in the accounts layout) owning the tools named", min: 1, max: -1, apply: addTeam, next: initTools},
	{name: "grant", args: "TEAM TOOL...", what: "grant tools to a team (a tool has one owner)", min: 2, max: -1, apply: grant, next: initTools},
	{name: "revoke", args: "TEAM TOOL...", what: "revoke tools of a team (taken away once the servers take the change: -push; a reload too with init -memory-resolver)", min: 2, max: -1, apply: revoke},
	{name: "remove-team", args: "TEAM", what: "remove a team: its executor user's files are deleted and its JWT revoked (in the accounts layout its account is kept with no import)", min: 1, max: 1, apply: removeTeam},
	{name: "add-client", args: "NAME IDENTITY...", what: "add client credentials (client-NAME; its own account in the accounts layout) that act and read only as the identities named", min: 2, max: -1, apply: addClient},
	{name: "remove-client", args: "NAME", what: "remove client-NAME: its files are deleted and its JWT revoked (in the accounts layout by its own account, kept with no import)", min: 1, max: 1, apply: removeClient},
	{name: "rotate", args: "USER", what: "issue one user new credentials (new password, nkey and JWT; the old JWT is revoked)", min: 1, max: 1, rotate: true},
	{name: "push", args: "", what: "push every account JWT to the running servers (after an edit without -push)", min: 0, max: 0},
	{name: "issue", args: "", what: "issue every file again from deployment.json and grants.json, pushing nothing unless -push (after editing deployment.json; servers on auth-users.conf or auth-nkeys.conf then reload)", min: 0, max: 0},
}

// initTools is what must run after a team is given tools (args: the team, its new
// tools): the tools' queues exist once `toolbus init --tools` made them with admin's
// credentials (a team's account may not create them), and the team's executors refuse
// to start until then.
func initTools(args []string) string {
	team, tools := args[0], args[1:]
	if len(tools) == 0 {
		return fmt.Sprintf("next: grant it tools (toolbus admin grant %s TOOL...), then create their queues: toolbus init --tools TOOL,...", team)
	}
	return fmt.Sprintf("next: create the queues of %s's new tools (admin's credentials; its executors refuse to start until then): toolbus init --tools %s",
		team, strings.Join(tools, ","))
}

func addTeam(g *natsjwt.Grants, args []string) error {
	team, tools := args[0], args[1:]
	if _, ok := g.Teams[team]; ok {
		return refused("team %s exists: grant it tools with toolbus admin grant %s TOOL...", team, team)
	}
	if err := unowned(*g, team, tools); err != nil {
		return err
	}
	if g.Teams == nil {
		g.Teams = map[string][]string{}
	}
	g.Teams[team] = append([]string{}, tools...)
	return nil
}

func grant(g *natsjwt.Grants, args []string) error {
	team, tools := args[0], args[1:]
	if err := known(*g, team); err != nil {
		return err
	}
	if err := unowned(*g, team, tools); err != nil {
		return err
	}
	for _, tool := range tools {
		if slices.Contains(g.Teams[team], tool) {
			return refused("team %s has tool %s already", team, tool)
		}
	}
	g.Teams[team] = append(g.Teams[team], tools...)
	return nil
}

func revoke(g *natsjwt.Grants, args []string) error {
	team, tools := args[0], args[1:]
	if err := known(*g, team); err != nil {
		return err
	}
	for _, tool := range tools {
		if !slices.Contains(g.Teams[team], tool) {
			return refused("team %s has no tool %s (its tools: %s)", team, tool, list(g.Teams[team]))
		}
	}
	g.Teams[team] = slices.DeleteFunc(g.Teams[team], func(t string) bool { return slices.Contains(tools, t) })
	return nil
}

func removeTeam(g *natsjwt.Grants, args []string) error {
	if err := known(*g, args[0]); err != nil {
		return err
	}
	delete(g.Teams, args[0])
	return nil
}

func addClient(g *natsjwt.Grants, args []string) error {
	name, ids := args[0], args[1:]
	if _, ok := g.Clients[name]; ok {
		return refused("client %s exists (%s): remove it first, toolbus admin remove-client %s (or rotate its credentials: toolbus admin rotate client-%s)", name, list(g.Clients[name]), name, name)
	}
	if g.Clients == nil {
		g.Clients = map[string][]string{}
	}
	g.Clients[name] = append([]string{}, ids...)
	return nil
}

func removeClient(g *natsjwt.Grants, args []string) error {
	if _, ok := g.Clients[args[0]]; !ok {
		return refused("no client %s (clients: %s); add one: toolbus admin add-client %s IDENTITY...", args[0], list(slices.Sorted(maps.Keys(g.Clients))), args[0])
	}
	delete(g.Clients, args[0])
	return nil
}

// known refuses a team the grants do not have, naming those they have.
func known(g natsjwt.Grants, team string) error {
	if _, ok := g.Teams[team]; !ok {
		return refused("no team %s (teams: %s); add it: toolbus admin add-team %s TOOL...", team, list(slices.Sorted(maps.Keys(g.Teams))), team)
	}
	return nil
}

// unowned refuses a tool another team than team owns: a tool has one owner.
func unowned(g natsjwt.Grants, team string, tools []string) error {
	for _, tool := range tools {
		for _, other := range slices.Sorted(maps.Keys(g.Teams)) {
			if other != team && slices.Contains(g.Teams[other], tool) {
				return refused("tool %s is owned by team %s: a tool has one owner (toolbus admin revoke %s %s first)", tool, other, other, tool)
			}
		}
	}
	return nil
}

// checkRotate refuses a user that is not one of the deployment's (s.users).
func checkRotate(s Settings, g natsjwt.Grants, user string) error {
	var names []string
	for _, u := range s.users(g) {
		if u.Name == user {
			return nil
		}
		names = append(names, u.Name)
	}
	return refused("no user %s (users: %s)", user, list(names))
}

func list(ss []string) string {
	if len(ss) == 0 {
		return "none"
	}
	return strings.Join(ss, ", ")
}
