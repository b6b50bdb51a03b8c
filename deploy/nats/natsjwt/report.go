package natsjwt

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultDir is where a deployment's files go unless told: toolbus/nats under the
// user's configuration directory ($XDG_CONFIG_HOME, else ~/.config on Linux), outside
// any repository, since they are secrets.
func DefaultDir() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("natsjwt: no default directory (%w): name one", err)
	}
	return filepath.Join(dir, "toolbus", "nats"), nil
}

// HandOut says what a change needs: whom to hand what, and what the servers need. An
// account's change pushed to the running servers (PushAccounts) needs nothing more;
// full says auth-jwt.conf has a full resolver (WithFullResolver), which takes accounts
// from a push, a new one too, and no changed one from a reload.
func (c Change) HandOut(pushed, full bool) string {
	switch {
	case c.Account && pushed:
		return pushedHandOut[c.What]
	case c.Account && full:
		return fullHandOut[c.What]
	case c.Account:
		return accountHandOut[c.What]
	case full:
		return fullUserHandOut[c.What]
	}
	return handOut[c.What]
}

// pushedHandOut: an account's JWT the running servers took at once (PushAccounts).
var pushedHandOut = map[string]string{
	"new":       ": pushed to the running servers; hand out its users' files",
	"changed":   ": pushed to the running servers, applied at once; its users keep their files and connections",
	"unchanged": ": pushed to the running servers",
	"removed":   ": pushed to the running servers, applied at once: its users' connections are cut",
}

// accountHandOut says what an account's change needs (the accounts layout, a memory
// resolver): its users' files are unchanged; the servers take the new account JWT or
// config on a reload.
var accountHandOut = map[string]string{
	"new":     ": reload the server (kill -HUP; the users and nkeys configs need a second reload for a new team's or client's imports); then hand out its users' files",
	"changed": ": reload the server (kill -HUP); its users keep their files and connections",
	"removed": ": kept with no import and its users revoked; reload the server (kill -HUP) or push it: its users' connections are cut",
}

// fullHandOut says what an account's change needs with a full resolver: a push (the
// server takes a changed account from a push only; the users and nkeys configs still
// take it on a reload).
var fullHandOut = map[string]string{
	"new":     ": push it (system.creds: toolbus admin push, natsjwt.PushAccounts); then hand out its users' files (the users and nkeys configs take it on a reload, a new team's or client's imports on a second one)",
	"changed": ": push it (system.creds: toolbus admin push, natsjwt.PushAccounts): the full resolver takes a changed account from a push, not from a reload; its users keep their files and connections",
	"removed": ": kept with no import and its users revoked; push it (system.creds: toolbus admin push, natsjwt.PushAccounts): its users' connections are cut",
}

var handOut = map[string]string{
	"new":     ": hand out its files; operator mode needs nothing on the server, users and nkeys a reload (nats-server --signal reload)",
	"changed": ": hand out its new files (same password and nkey); reload the server (an old JWT that may do more than the new one is revoked once it does)",
	"removed": ": its files are deleted; reload the server (users, nkeys; in operator mode its JWT is revoked)",
	"rotated": ": hand out its new files; reload the server (the old password, nkey and JWT stop working once it does)",
}

// fullUserHandOut: a user's change with a full resolver, whose revocations are in an
// account JWT the servers take from a push.
var fullUserHandOut = map[string]string{
	"new":     ": hand out its files; operator mode needs nothing more on the server, users and nkeys a reload (nats-server --signal reload)",
	"changed": ": hand out its new files (same password and nkey); operator mode: push its account (an old JWT that may do more than the new one is revoked once it is pushed), users and nkeys: reload the server",
	"removed": ": its files are deleted; operator mode: push its account (its JWT is revoked), users and nkeys: reload the server",
	"rotated": ": hand out its new files; operator mode: push its account (the old JWT stops working then), users and nkeys: reload the server (the old password and nkey stop working then)",
}

// WriteChanges prints what a run of GenerateGrants changed, one line a user or account,
// with what each change needs (HandOut); pushed says which accounts' changes the
// running servers took already; full that auth-jwt.conf has a full resolver
// (Result.ResolverDir). go run ./deploy/nats/gen and toolbus admin print it.
func WriteChanges(w io.Writer, changes []Change, pushed func(Change) bool, full bool) {
	for _, c := range changes {
		fmt.Fprintf(w, "%-9s %s%s\n", c.What, Shown(c.User), c.HandOut(pushed != nil && pushed(c), full))
	}
}

// Shown is how a change's user or account (Change.User) is printed: a tenant's account
// by whose it is ("account of team alpha", "account of client bob"), not by its name,
// which repeats the kind (team team-a's account is named team-team-a).
func Shown(user string) string {
	if team, ok := strings.CutPrefix(user, "account "+teamKeyPrefix); ok {
		return "account of team " + team
	}
	if client, ok := strings.CutPrefix(user, "account "+ClientUser("")); ok {
		return "account of client " + client
	}
	return user
}

// WriteUser prints the files of user (credentials, password, nkey seed) and, for a
// team's executor user, the settings its executors run with (a client's in the accounts
// layout: the settings it runs with), each comment of them on a line of its own.
func WriteUser(w io.Writer, res Result, user string) {
	files := slices.DeleteFunc([]string{res.Creds[user], res.Passwords[user], res.Seeds[user]}, func(f string) bool { return f == "" })
	fmt.Fprintf(w, "%-20s %s\n", user, strings.Join(files, "  "))
	var env, notes []string
	for _, e := range res.Env[user] {
		if strings.HasPrefix(e, "#") {
			notes = append(notes, e)
		} else {
			env = append(env, e)
		}
	}
	who := "its executors run"
	if strings.HasPrefix(user, "client-") {
		who = "it runs"
	}
	if len(env) > 0 {
		fmt.Fprintf(w, "%-20s %s with %s\n", "", who, strings.Join(env, " "))
	}
	for _, n := range notes {
		fmt.Fprintf(w, "%-20s %s\n", "", n)
	}
}
