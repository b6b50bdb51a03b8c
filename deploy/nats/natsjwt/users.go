package natsjwt

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/store"
)

// Grants is what an administrator grants: the tools each team owns. Each team gets an
// executor user, "executor-<team>", whose permissions are TEAM_EXECUTOR plus the team's
// own instance records and, for each of its tools, the queue, catalog entry, claims,
// outputs and results of that tool only (TeamPermissions). A tool belongs to one team at
// most. The team's executors run with TOOLBUS_TEAM=<team> (worker.Config.Team).
//
// Clients binds client credentials to identities: each entry "<name>": [<identity>, ...]
// gets a client user, "client-<name>", whose permissions are CLIENT's with the
// identity-bearing subjects (run.started.<principal>, approval.<decision>.<actor>,
// run.cancel.<actor>) narrowed to those identities (ClientPermissions): it starts runs
// only for them and decides and cancels only as them. One identity makes a credential
// of one person or service; several make a front door (a gateway that authenticates its
// own users, such as `toolbus mcp --http` or the console) trusted for those. The
// shipped "client" role may name any identity: it is such a front door for everyone.
type Grants struct {
	Teams   map[string][]string `json:"teams"`
	Clients map[string][]string `json:"clients,omitempty"`
}

// ReadGrants reads a grants file (JSON: {"teams": {"<team>": ["<tool>", ...]}}) and
// validates it.
func ReadGrants(file string) (Grants, error) {
	var g Grants
	b, err := os.ReadFile(file)
	if err != nil {
		return g, fmt.Errorf("natsjwt: %w", err)
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("natsjwt: %s: %w", file, err)
	}
	if err := g.Validate(); err != nil {
		return g, fmt.Errorf("natsjwt: %s: %w", file, err)
	}
	return g, nil
}

// nameRE is what a client name may be (the same as a team's, store.ValidTeam).
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// Validate checks team names ([a-z0-9_-], at most 32), tool names (toolbus tool names,
// not the unknown-tool token) and that no tool is granted to two teams.
func (g Grants) Validate() error {
	owner := map[string]string{}
	for _, team := range slices.Sorted(maps.Keys(g.Teams)) {
		// The team is a token of its instance records' keys (store.InstanceKey).
		if !store.ValidTeam(team) {
			return fmt.Errorf("invalid team name %q: 1 to 32 of [a-z0-9_-]", team)
		}
		for _, tool := range g.Teams[team] {
			if !toolbus.ValidToolName(tool) || tool == events.UnknownToolToken {
				return fmt.Errorf("team %s: invalid tool name %q", team, tool)
			}
			if o, ok := owner[tool]; ok {
				return fmt.Errorf("tool %s granted to two teams: %s and %s", tool, o, team)
			}
			owner[tool] = team
		}
	}
	for _, name := range slices.Sorted(maps.Keys(g.Clients)) {
		if !nameRE.MatchString(name) {
			return fmt.Errorf("invalid client name %q: 1 to 32 of [a-z0-9_-]", name)
		}
		if len(g.Clients[name]) == 0 {
			return fmt.Errorf("client %s: no identity", name)
		}
		for _, id := range g.Clients[name] {
			// "_none" (and every token starting with "_") is reserved: it stands for no
			// identity, which a bound credential never is.
			if events.IdentityToken(id) != id || strings.HasPrefix(id, "_") {
				return fmt.Errorf("client %s: invalid identity %q: %s, not starting with _", name, id, toolbus.IDShape)
			}
		}
	}
	return nil
}

// ClientUser is the user name of client credentials bound to identities.
func ClientUser(name string) string { return "client-" + name }

// identitySubjects are the subjects of CLIENT whose last token is an identity
// (events.IdentityToken), each with a "*" there: ClientPermissions narrows them.
var identitySubjects = []string{
	events.SubjectPrefix + ".*.run.started.*",
	events.SubjectPrefix + ".*.run.cancel.*",
	events.SubjectPrefix + ".*.approval.granted.*",
	events.SubjectPrefix + ".*.approval.denied.*",
	events.SubjectPrefix + ".*.tool.answer.*",
}

// fairHeldAll is CLIENT's subject of what the fair scheduler holds of every tenant
// (events.FairHeldSubject); a bound client asks only events.FairHeldForSubject.
const fairHeldAll = events.FairHeldPrefix + ".*"

// ClientPermissions returns the client template (CLIENT) with its identity-bearing
// subjects allowed only for ids: the server then refuses a run.started for another
// principal, and an approval or a cancel in another actor's name.
func ClientPermissions(template Permissions, ids []string) (Permissions, error) {
	p := Permissions{PubDeny: slices.Clone(template.PubDeny),
		SubAllow: slices.Clone(template.SubAllow), SubDeny: slices.Clone(template.SubDeny)}
	found, fairHeld := 0, false
	for _, s := range template.PubAllow {
		if s == fairHeldAll || s == fairHeldAll+".*" {
			fairHeld = true
			continue
		}
		if !slices.Contains(identitySubjects, s) {
			p.PubAllow = append(p.PubAllow, s)
			continue
		}
		found++
		for _, id := range ids {
			p.PubAllow = append(p.PubAllow, strings.TrimSuffix(s, "*")+id)
		}
	}
	if found != len(identitySubjects) {
		return Permissions{}, fmt.Errorf("natsjwt: CLIENT allows %d of the identity subjects %v: cannot bind it", found, identitySubjects)
	}
	// What the fair scheduler holds: of its identities only, never every tenant's.
	for _, id := range ids {
		if fairHeld {
			p.PubAllow = append(p.PubAllow, fairHeldAll+"."+id)
		}
	}
	return p, nil
}

// TeamUser is the user name of a team's executor credentials.
func TeamUser(team string) string { return "executor-" + team }

// TeamPermissions returns the template (TEAM_EXECUTOR) with the subjects of team and
// its tools added: write the team's instance records (store.InstanceKey: keys of three
// tokens starting with the team's), pull and ack the tools' queues, write their catalog
// entries, claims and outputs, publish their results, waiting notices and progress, and
// listen to their calls while their queues are idle.
func TeamPermissions(template Permissions, stream, team string, tools []string) Permissions {
	p := Permissions{PubAllow: slices.Clone(template.PubAllow), PubDeny: slices.Clone(template.PubDeny),
		SubAllow: slices.Clone(template.SubAllow), SubDeny: slices.Clone(template.SubDeny)}
	p.PubAllow = append(p.PubAllow, store.KeySubject(store.BucketInstances, team+".*.*"))
	queues := events.QueueStreamName(stream)
	for _, tool := range tools {
		durable := events.ToolConsumer(tool)
		// Its own queue's acknowledgements only: a wider ack subject reaches every
		// consumer of the account (accounts.AckSubjects).
		ackV1, ackV2 := accounts.AckSubjects(queues, durable)
		p.PubAllow = append(p.PubAllow,
			"$JS.API.CONSUMER.MSG.NEXT."+queues+"."+durable,
			ackV1,
			ackV2,
			store.KeySubject(store.BucketTools, tool),
			store.KeySubject(store.BucketClaims, tool+".>"),
			store.KeySubject(store.BucketOutputs, tool+".>"),
			events.SubjectPrefix+".*.tool.finished."+tool,
			events.SubjectPrefix+".*.tool.waiting."+tool,
			events.SubjectPrefix+".*.tool.progress."+tool,
			events.SubjectPrefix+".*.tool.log."+tool,
			events.SubjectPrefix+".*.tool.question."+tool,
		)
		// The doorbell of the tool's queue while it is idle (consume.Doorbell).
		p.SubAllow = append(p.SubAllow, events.FilterToolRequestedFor(tool))
	}
	return p
}

// User is one set of credentials to issue: a name and its permissions.
type User struct {
	Name  string
	Perms Permissions
	// Team is the team of a team's executor user ("" for the roles and clients): in the
	// accounts layout (WithAccounts) it lives in its team's account.
	Team string
	// Client is the name of a bound client's user ("" for the roles and teams): in the
	// accounts layout it lives in its client's account (accounts.ClientAccount).
	Client string
}

// tenant reports whether u lives in an account of its own in the accounts layout.
func (u User) tenant() bool { return u.Team != "" || u.Client != "" }

// Users lists the users of perms (the roles) and grants (one executor per team), in a
// stable order: the roles, then the teams by name.
func Users(perms map[string]Permissions, g Grants) []User {
	var out []User
	for _, role := range Roles {
		out = append(out, User{Name: role, Perms: perms[role]})
	}
	for _, team := range slices.Sorted(maps.Keys(g.Teams)) {
		out = append(out, User{Name: TeamUser(team), Perms: TeamPermissions(perms[TeamTemplate], events.DefaultStream, team, g.Teams[team]), Team: team})
	}
	for _, name := range slices.Sorted(maps.Keys(g.Clients)) {
		// An unbindable template leaves no permission at all (fail closed); GenerateGrants
		// reports the error.
		p, _ := ClientPermissions(perms["client"], g.Clients[name]) //nolint:errcheck // checked by GenerateGrants
		out = append(out, User{Name: ClientUser(name), Perms: p, Client: name})
	}
	return out
}

// withWriteForwards is the injector's permissions in the accounts layout: its
// permissions.conf role may also publish what its write service forwards of tenants'
// writes (accounts.WriteForwards), and no deny of the role stops a forward (it still
// reads no secret). It may subscribe to the service's subjects (events.WriteServicePrefix)
// even when the role does not list them: a deployment's permissions copied by an older
// version's toolbus admin init lack them, and its injectors must run the service once
// toolbus admin push has moved the tenants' writes to it
// (TestInjectorSubscribesToTheWriteService; in cmd/toolbus/internal/admin, TestUpgradeFrom9c054fc).
func withWriteForwards(p Permissions) Permissions {
	fwd := accounts.WriteForwards()
	out := Permissions{PubAllow: append(slices.Clone(p.PubAllow), fwd...), SubAllow: p.SubAllow, SubDeny: p.SubDeny, Responses: p.Responses}
	if svc := events.WriteServicePrefix + ".>"; !slices.Contains(p.SubAllow, svc) {
		out.SubAllow = append(slices.Clone(p.SubAllow), svc)
	}
	for _, d := range p.PubDeny {
		if !slices.ContainsFunc(fwd, func(f string) bool { return server.SubjectsCollide(f, d) }) {
			out.PubDeny = append(out.PubDeny, d)
		}
	}
	return out
}
