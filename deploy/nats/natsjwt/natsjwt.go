// Package natsjwt issues the credentials of toolbus from deploy/nats/permissions.conf
// and an administrator's grants (which team serves which tools): one user per role and
// one executor user per team, in each kind NATS offers: user/password (bcrypt hashes in
// the server config, the passwords in files), nkeys (public keys in the server config,
// the seeds in files) and the operator/JWT setup (an operator, a system account, a
// TOOLBUS account with JetStream, and one user JWT per user carrying its permissions).
// `go run ./deploy/nats/gen` calls it; the security tests start servers from what it
// writes.
package natsjwt

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/store"
)

// Roles are the toolbus roles, as named in permissions.conf (upper case there).
var Roles = []string{"admin", "planner", "executor", "injector", "client"}

// Permissions of one role: the publish and subscribe allow and deny lists.
type Permissions struct {
	PubAllow, PubDeny, SubAllow, SubDeny []string
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
				return fmt.Errorf("client %s: invalid identity %q: 1 to 128 of [A-Za-z0-9_-], not starting with _", name, id)
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
	p.PubAllow = append(p.PubAllow, "$KV."+store.BucketInstances+"."+team+".*.*")
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
			"$KV."+store.BucketTools+"."+tool,
			"$KV."+store.BucketClaims+"."+tool+".>",
			"$KV."+store.BucketOutputs+"."+tool+".>",
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
// (TestInjectorSubscribesToTheWriteService; in internal/admin, TestUpgradeFrom9c054fc).
func withWriteForwards(p Permissions) Permissions {
	fwd := accounts.WriteForwards()
	out := Permissions{PubAllow: append(slices.Clone(p.PubAllow), fwd...), SubAllow: p.SubAllow, SubDeny: p.SubDeny}
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

// Result is what Generate wrote.
type Result struct {
	// Config is the server configuration of the operator/JWT setup (auth-jwt.conf):
	// listen, JetStream, operator, system account and a resolver preloaded with the
	// account JWTs: a memory resolver, or a full one (WithFullResolver).
	Config string
	// ResolverDir is the full resolver's directory in Config ("": a memory resolver).
	ResolverDir string
	// UsersConfig (auth-users.conf) and NkeysConfig (auth-nkeys.conf) are the server
	// configurations of the user/password and nkey setups: single.conf's settings and
	// one user per role and team with its permissions inline.
	UsersConfig, NkeysConfig string
	// Creds maps each user (role, or TeamUser) to its credentials file
	// (TOOLBUS_NATS_CREDS), Passwords to the file holding its password
	// (TOOLBUS_NATS_USER=<user>, TOOLBUS_NATS_PASSWORD), Seeds to its nkey seed file
	// (TOOLBUS_NATS_NKEY).
	Creds, Passwords, Seeds map[string]string
	// Operator, System and Account are the public keys.
	Operator, System, Account string
	// TeamAccounts maps each team to its account's public key in the accounts layout
	// (WithAccounts), ClientAccounts each bound client (and each removed client whose
	// account is kept to revoke its users) to its; AccountJWTs maps every account's
	// public key (system, core, teams, clients) to its JWT, as auth-jwt.conf preloads
	// them (PushAccounts pushes them).
	TeamAccounts, ClientAccounts, AccountJWTs map[string]string
	// SystemCreds (system.creds, the accounts layout) is a user of the system account
	// that may only push account JWTs to the servers (PushAccounts).
	SystemCreds string
	// Env is, for each team's executor user, the settings its executors run with
	// besides its credentials: TOOLBUS_TEAM, TOOLBUS_EXECUTOR_TOOLS and, in the accounts
	// layout, TOOLBUS_NATS_API_PREFIX=JS.core.API (CoreAPIPrefix); in the accounts layout,
	// for each bound client's user, TOOLBUS_NATS_READ_PREFIX of its first identity
	// (events.ReadAPIPrefix) and ReadPrefixNote. An entry starting with "#" is a comment.
	Env map[string][]string
	// K8sSecrets (k8s-secrets.yaml) holds one Kubernetes Secret per user,
	// toolbus-nats-<user> with the keys user, password and bcrypt, in the shape the
	// manifests of deploy/k8s read (deploy/README.md, "Kubernetes").
	K8sSecrets string
	// Changes says, user by user, what this run did: a run on a directory that holds
	// a deployment's keys keeps them and every credential whose permissions did not
	// change.
	Changes []Change
}

// Generate writes the credentials of the roles of permsFile, without teams (see
// GenerateGrants).
func Generate(permsFile, dir string) (Result, error) { return GenerateGrants(permsFile, dir, Grants{}) }

// GenerateGrants writes, into dir, for every role of permsFile and every team and
// bound client of g:
// auth-jwt.conf and one <user>.creds; auth-users.conf and one <user>.password;
// auth-nkeys.conf and one <user>.nk; plus the seeds of the operator, the system account
// and the account (operator.nk, system.nk, account.nk: keep them offline, they sign new
// users). A directory that already holds them is a deployment's: its keys, passwords
// and nkeys are kept, a user whose permissions did not change keeps its .creds file
// as it was, a user no longer granted is removed (its JWT revoked), and Result.Changes
// says which is which. Adding a team or a bound client then needs nothing on a server
// in operator mode with one account, in the accounts layout a push of its new account
// (PushAccounts) with a full resolver (WithFullResolver) or a reload with the memory
// one; the users and nkeys configs need a reload (SIGHUP: kill -HUP the toolbus server,
// or nats-server --signal reload), which keeps every connection. The
// server settings of auth-users.conf and auth-nkeys.conf are those of single.conf, next
// to permsFile, listening on loopback (WithListen) and storing where WithStoreDir says.
// WithAccounts issues the accounts layout: also team-<team>.nk and team-<team>.jwt per
// team and account-client-<name>.nk and .jwt per bound client (its account's key and
// JWT, kept) and system.creds (PushAccounts). A client removed from g keeps its account,
// issued with no import and its users revoked, so that the servers cut them when they
// take it (a reload, a push).
func GenerateGrants(permsFile, dir string, g Grants, opts ...Option) (Result, error) {
	o := options{bcryptCost: bcrypt.DefaultCost, listen: DefaultListen}
	for _, f := range opts {
		f(&o)
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return Result{}, fmt.Errorf("natsjwt: listen address %q: %w", o.listen, err)
	}
	if err := g.Validate(); err != nil {
		return Result{}, fmt.Errorf("natsjwt: grants: %w", err)
	}
	if err := o.limits.Validate(); err != nil {
		return Result{}, fmt.Errorf("natsjwt: %w", err)
	}
	if len(o.kinds) > 0 && !o.issues(KindJWT) {
		return Result{}, errors.New("natsjwt: the kinds of credentials must include jwt (ParseKinds)")
	}
	if o.resolverDir != "" && !o.accounts {
		return Result{}, errors.New("natsjwt: a full resolver needs the accounts layout (WithAccounts): it takes changed accounts from a push with system.creds, which only that layout issues")
	}
	perms, err := ReadPermissions(permsFile)
	if err != nil {
		return Result{}, err
	}
	single, err := serverSettings(filepath.Join(filepath.Dir(permsFile), "single.conf"), o)
	if err != nil {
		return Result{}, err
	}
	if len(g.Clients) > 0 {
		if _, err := ClientPermissions(perms["client"], nil); err != nil {
			return Result{}, err
		}
	}
	users := Users(perms, g)
	if o.accounts && o.noCoreWide {
		users = slices.DeleteFunc(users, func(u User) bool { return !u.tenant() && slices.Contains(CoreWide, u.Name) })
	}
	if o.accounts {
		// A team's user lives in its team's account, which holds nothing but the
		// imports of its tools (TeamExports), and a client's in its client's account
		// (ClientExports): the account is the boundary, so the user is left open inside
		// it (one list of what crosses, not two that may drift).
		for i := range users {
			switch {
			case users[i].tenant():
				users[i].Perms = Permissions{}
			case users[i].Name == "injector":
				users[i].Perms = withWriteForwards(users[i].Perms)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Result{}, fmt.Errorf("natsjwt: %w", err)
	}
	write := func(name string, data []byte) (string, error) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return "", fmt.Errorf("natsjwt: %w", err)
		}
		return p, nil
	}
	res := Result{Creds: map[string]string{}, Passwords: map[string]string{}, Seeds: map[string]string{}, ResolverDir: o.resolverDir}
	kr := keyring{dir: dir}
	if err := issueKept(users, kr, g, o, write, &res); err != nil {
		return Result{}, err
	}
	res.Env = tenantEnv(users, g, o)
	if err := dropKinds(dir, users, o); err != nil {
		return Result{}, err
	}
	if err := writeConfigKinds(users, g, o, kr, single, write, &res); err != nil {
		return Result{}, err
	}
	return res, nil
}

// ReadPrefixNote is the comment line of a client's settings in the accounts layout
// (Result.Env): the read prefix names one identity.
const ReadPrefixNote = "# a client bound to several identities sets TOOLBUS_NATS_READ_PREFIX per identity: toolbus_read.<identity>.API"

// tenantEnv is what each team's executors run with besides their credentials and, in
// the accounts layout, what each bound client runs with: the read service's prefix of
// its first identity (events.ReadAPIPrefix), and ReadPrefixNote.
func tenantEnv(users []User, g Grants, o options) map[string][]string {
	env := map[string][]string{}
	for _, u := range users {
		if u.Client != "" && o.accounts {
			env[u.Name] = []string{"TOOLBUS_NATS_READ_PREFIX=" + events.ReadAPIPrefix(g.Clients[u.Client][0]), ReadPrefixNote}
		}
		if u.Team == "" {
			continue
		}
		env[u.Name] = []string{"TOOLBUS_TEAM=" + u.Team, "TOOLBUS_EXECUTOR_TOOLS=" + strings.Join(g.Teams[u.Team], ",")}
		if o.accounts {
			env[u.Name] = append(env[u.Name], "TOOLBUS_NATS_API_PREFIX="+CoreAPIPrefix)
		}
	}
	return env
}

// writeConfigKinds writes the user/password and nkey kinds (auth-users.conf and
// auth-nkeys.conf, the same users with their permissions inline, and in the accounts
// layout in their accounts) and k8s-secrets.yaml, with the server settings single.
func writeConfigKinds(users []User, g Grants, o options, kr keyring, single string, write func(string, []byte) (string, error), res *Result) error {
	var pwUsers, nkUsers, secrets strings.Builder
	// In the accounts layout a team's or client's users go into its account's block.
	pw := accounts.Layout{Teams: g.Teams, Clients: g.Clients, TeamUsers: map[string]string{}, ClientUsers: map[string]string{}, Limits: o.limits}
	nk := pw
	nk.TeamUsers, nk.ClientUsers = map[string]string{}, map[string]string{}
	userLine := func(u User, ident string) string {
		if o.accounts && u.tenant() {
			return "      {" + ident + "}\n"
		}
		return "    {" + ident + ", permissions: " + confPermissions(u.Perms) + "}\n"
	}
	// add puts a user's line into its account's block (the accounts layout) or core.
	add := func(l accounts.Layout, core *strings.Builder, u User, line string) {
		switch {
		case !o.accounts || !u.tenant():
			core.WriteString(line)
		case u.Team != "":
			l.TeamUsers[u.Team] += line
		default:
			l.ClientUsers[u.Client] += line
		}
	}
	kept := kr.hashes()
	for _, u := range users {
		if !o.issues(KindUsers) {
			break
		}
		password, err := kr.password(u.Name)
		if err != nil {
			return err
		}
		hash, err := keptHash(kept[u.Name], password, o.bcryptCost)
		if err != nil {
			return err
		}
		if res.Passwords[u.Name], err = write(u.Name+".password", []byte(password)); err != nil {
			return err
		}
		add(pw, &pwUsers, u, userLine(u, fmt.Sprintf("user: %q, password: %q", u.Name, hash)))
		// JSON strings are YAML double-quoted scalars: a bcrypt hash's "$" needs no escaping.
		fmt.Fprintf(&secrets, "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %q\n  namespace: toolbus\ntype: Opaque\nstringData:\n  user: %q\n  password: %q\n  bcrypt: %q\n",
			"toolbus-nats-"+u.Name, u.Name, password, hash)
	}
	for _, u := range users {
		if !o.issues(KindNkeys) {
			break
		}
		kp, err := kr.seed(u.Name+".nk", nkeys.CreateUser)
		if err != nil {
			return err
		}
		pub, _ := kp.PublicKey()
		res.Seeds[u.Name] = filepath.Join(kr.dir, u.Name+".nk")
		indent := "    # "
		if o.accounts && u.tenant() {
			indent = "      # "
		}
		add(nk, &nkUsers, u, indent+u.Name+"\n"+userLine(u, fmt.Sprintf("nkey: %q", pub)))
	}
	auth := func(users string, l accounts.Layout) string {
		if o.accounts {
			l.CoreUsers = users
			return l.Conf()
		}
		return "authorization {\n  users = [\n" + users + "  ]\n}\n"
	}
	head := func(kind string) string { return configHead(o, single, kind) }
	var err error
	if o.issues(KindNkeys) {
		if res.NkeysConfig, err = write("auth-nkeys.conf", []byte(head("nkeys (public keys; the seeds are in <user>.nk)")+
			auth(nkUsers.String(), nk))); err != nil {
			return err
		}
	}
	if !o.issues(KindUsers) {
		return nil
	}
	if res.UsersConfig, err = write("auth-users.conf", []byte(head("users and passwords (bcrypt hashes; the passwords are in <user>.password)")+
		auth(pwUsers.String(), pw))); err != nil {
		return err
	}
	if res.K8sSecrets, err = write("k8s-secrets.yaml", []byte("# toolbus NATS credentials as Kubernetes Secrets, written by go run ./deploy/nats/gen\n"+
		"# (kubectl apply -f k8s-secrets.yaml): one toolbus-nats-<user> per role and team, with the\n"+
		"# password of auth-users.conf. Holds secrets: keep it out of git.\n"+secrets.String())); err != nil {
		return err
	}
	return nil
}

// configHead is the head of the users or nkeys config of kind, with the server settings
// single.
func configHead(o options, single, kind string) string {
	layout := ""
	if o.accounts {
		layout = "# The accounts layout: the roles' users in CORE, each team's executor user in its\n" +
			"# TEAM_<team> account, which imports only its tools' subjects (natsjwt.TeamExports),\n" +
			"# each bound client's user in its CLIENT_<name> account, which imports only its\n" +
			"# identities' starts, decisions, cancels, answers and reads (natsjwt.ClientExports).\n"
	}
	return fmt.Sprintf(`# toolbus with %s, written by go run ./deploy/nats/gen: one user per role and
# one executor user per team (executor-<team>), each with its permissions inline (the
# roles' from permissions.conf, the teams' from TEAM_EXECUTOR plus their granted tools).
# Generated: regenerate it when permissions.conf or the grants change.
`, kind) + layout + single + "\n"
}

// issueKept issues the operator/JWT setup from the keys kept in kr: removed users' files
// go (their JWTs revoked), rotated users' credentials are forgotten, and the changes of
// every user land in res.
func issueKept(users []User, kr keyring, g Grants, o options, write func(string, []byte) (string, error), res *Result) error {
	revoked, err := kr.revocations()
	if err != nil {
		return err
	}
	if res.Changes, err = kr.removed(users, revoked); err != nil {
		return err
	}
	if err := kr.rotate(users, o.rotate, revoked); err != nil {
		return err
	}
	if err := generateJWT(users, kr, g, revoked, o, write, res); err != nil {
		return err
	}
	for i, c := range res.Changes {
		if slices.Contains(o.rotate, c.User) {
			res.Changes[i].What = "rotated"
		}
	}
	return nil
}

// Option changes how GenerateGrants issues credentials.
type Option func(*options)

type options struct {
	bcryptCost int
	rotate     []string
	// listen is the client address of the configs; store their JetStream store
	// directory ("": none, the server is given one: toolbus server -sd DIR).
	listen, store string
	// accounts: the accounts layout (WithAccounts).
	accounts bool
	// resolverDir is the full resolver's directory (WithFullResolver; "": a memory
	// resolver).
	resolverDir string
	// limits caps each tenant's account in the accounts layout (WithTenantLimits).
	limits accounts.TenantLimits
	// noCoreWide: the accounts layout issues no CoreWide user (WithoutCoreWide).
	noCoreWide bool
	// kinds are the kinds of credentials issued (WithKinds; nil: every kind).
	kinds []string
}

// CoreWide are the role users of the core account that act for every tenant: the shared
// executor serves every team's tools and reads every run, the shared client starts,
// decides, cancels and reads every run in anyone's name. The one-account layout needs
// them; in the accounts layout teams and clients have accounts of their own, and these
// are for trusted deployments only (WithoutCoreWide leaves them out).
var CoreWide = []string{"executor", "client"}

// CoreWideNote says what a CoreWide user's credentials can do ("" for any other user).
func CoreWideNote(user string) string {
	switch user {
	case "executor":
		return "core-wide: serves every team's tools and reads every run of every team and client; for one trusted team only, teams get executor-<team> (add-team)"
	case "client":
		return "core-wide: starts, decides, cancels and reads every run in anyone's name; for a door trusted by everyone only, clients and doors get client-<name> bound to their identities (add-client)"
	}
	return ""
}

// WithoutCoreWide leaves the CoreWide users out of the accounts layout (WithAccounts):
// their files are not written, and a run on a directory that holds them removes them
// and revokes their JWTs, as for any user no longer issued. toolbus admin init issues
// them only when asked (-core-wide).
func WithoutCoreWide() Option { return func(o *options) { o.noCoreWide = true } }

// WithTenantLimits sets the limits of each team's and client's account in the accounts
// layout, in every kind of credentials (accounts.TenantLimits: a field of 0 is its
// default, -1 no limit); without it they are accounts.DefaultTenantLimits. The core
// account has none; -one-account (no WithAccounts) has no tenant account to limit.
func WithTenantLimits(l accounts.TenantLimits) Option { return func(o *options) { o.limits = l } }

// WithFullResolver writes auth-jwt.conf with a full resolver storing the account JWTs
// in dir, a directory the server may write (an absolute path as the server sees it; a
// relative one is the server's working directory's, as a store_dir). The preload stays,
// so a server started on a new directory has every account; a push
// (PushAccounts) then stores a new or changed account at once, a new team's or client's
// too, with no reload. Only with WithAccounts, whose system.creds pushes: a full
// resolver takes a changed account from a push, not from a reload. Without it
// auth-jwt.conf has a memory resolver: the preload only, a new account needs a reload.
func WithFullResolver(dir string) Option { return func(o *options) { o.resolverDir = dir } }

// WithAccounts issues the accounts layout (docs/tenancy-design.md): the core account
// holds the stream, the buckets and every role's user; each team gets an account of its
// own (JWT kind: its own account key, kept across runs) holding its executor user, which
// imports of the core only what TeamExports lists, the JetStream API under CoreAPIPrefix.
// Its executors need TOOLBUS_NATS_API_PREFIX=JS.core.API (Result.Env). Each bound client
// gets one too (CLIENT_<name>, JWT client-<name>) holding its client-<name> user, which
// imports only ClientExports of its identities: no JetStream API at all, its reads go to
// the core's read service (TOOLBUS_NATS_READ_PREFIX, Result.Env). Off by default: one
// account with user permissions per role, team and client.
func WithAccounts() Option { return func(o *options) { o.accounts = true } }

// WithRotate issues new credentials for users (a new password, nkey and JWT, the old
// JWT revoked) and keeps everyone else's: a leaked or departing credential is replaced
// without touching another tenant. Result.Changes reports them as "rotated".
func WithRotate(users ...string) Option {
	return func(o *options) { o.rotate = append(o.rotate, users...) }
}

// WithBcryptCost sets the cost of the password hashes (default bcrypt.DefaultCost): the
// server pays it on every login; tests lower it.
func WithBcryptCost(cost int) Option { return func(o *options) { o.bcryptCost = cost } }

// DefaultListen is the client address of the configs GenerateGrants writes unless
// WithListen says otherwise: loopback, reachable from other hosts only on purpose.
const DefaultListen = "127.0.0.1:4222"

// WithListen sets the client address (host:port) the configs listen on (default
// DefaultListen; "0.0.0.0:4222" for every interface).
func WithListen(hostport string) Option { return func(o *options) { o.listen = hostport } }

// WithStoreDir writes dir as the configs' JetStream store_dir. Without it the configs
// name none and the server is given one when it starts (toolbus server -sd DIR, or
// nats-server -sd DIR, which refuses a store_dir in the file).
func WithStoreDir(dir string) Option { return func(o *options) { o.store = dir } }

// storeSetting is the store_dir line of a generated config, or a comment saying where
// the directory comes from when o names none.
func storeSetting(o options) string {
	if o.store == "" {
		return "# no store_dir: give it when starting the server (toolbus server -sd DIR)"
	}
	return "store_dir: " + strconv.Quote(o.store)
}

var (
	listenLine   = regexp.MustCompile(`(?m)^listen:.*$`)
	storeDirLine = regexp.MustCompile(`(?m)^(\s*)store_dir:.*$`)
)

// serverSettings is single.conf's text for the users and nkeys configs: without its
// leading comment (it is about single.conf itself), listening on o.listen and storing
// in o.store.
func serverSettings(file string, o options) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("natsjwt: server settings: %w", err)
	}
	s := string(b)
	for strings.HasPrefix(s, "#") {
		_, s, _ = strings.Cut(s, "\n")
	}
	if !listenLine.MatchString(s) || !storeDirLine.MatchString(s) {
		return "", fmt.Errorf("natsjwt: server settings: %s has no listen or store_dir line to set", file)
	}
	s = listenLine.ReplaceAllLiteralString(s, "listen: "+o.listen)
	return storeDirLine.ReplaceAllString(s, "${1}"+strings.ReplaceAll(storeSetting(o), "$", "$$")), nil
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
	return fmt.Sprintf("{publish: {allow: %s, deny: %s}, subscribe: {allow: %s, deny: %s}}",
		list(p.PubAllow), list(p.PubDeny), list(p.SubAllow), list(p.SubDeny))
}

func generateJWT(users []User, kr keyring, g Grants, revoked revocations, o options, write func(string, []byte) (string, error), res *Result) error {
	okp, err := kr.seed("operator.nk", nkeys.CreateOperator)
	if err != nil {
		return err
	}
	opub, _ := okp.PublicKey()
	skp, err := kr.seed("system.nk", nkeys.CreateAccount)
	if err != nil {
		return err
	}
	spub, _ := skp.PublicKey()
	akp, err := kr.seed("account.nk", nkeys.CreateAccount)
	if err != nil {
		return err
	}
	apub, _ := akp.PublicKey()

	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "toolbus"
	oc.SystemAccount = spub
	opJWT, err := kr.kept("operator.jwt", func() (string, error) { return oc.Encode(okp) }, sameOperator(oc))
	if err != nil {
		return err
	}
	sc := jwt.NewAccountClaims(spub)
	sc.Name = "SYS"
	sysJWT, err := kr.kept("system.jwt", func() (string, error) { return sc.Encode(okp) }, sameAccount(sc))
	if err != nil {
		return err
	}
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "TOOLBUS"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	res.Operator, res.System, res.Account = opub, spub, apub
	res.TeamAccounts, res.ClientAccounts, res.AccountJWTs = map[string]string{}, map[string]string{}, map[string]string{}
	var tenants []tenantAccount
	if o.accounts {
		ac.Exports = coreJWTExports()
		if tenants, err = tenantAccounts(kr, g); err != nil {
			return err
		}
		for _, t := range tenants {
			if t.team != "" {
				res.TeamAccounts[t.team] = t.pub
			} else {
				res.ClientAccounts[t.client] = t.pub
			}
		}
	}
	signer := func(u User) (nkeys.KeyPair, string) {
		for _, t := range tenants {
			if (u.Team != "" && t.team == u.Team) || (u.Client != "" && t.client == u.Client) {
				return t.kp, t.pub
			}
		}
		return akp, apub
	}
	if err := issueUsers(users, kr, signer, revoked, write, res); err != nil {
		return err
	}
	for key, at := range revoked.all {
		ac.RevokeAt(key, time.Unix(at, 0))
	}
	if b, _ := json.MarshalIndent(revoked.all, "", "  "); len(revoked.all) > 0 {
		if _, err := write(revocationsFile, b); err != nil {
			return err
		}
	}
	accJWT, what, err := kr.keep("account.jwt", func() (string, error) { return ac.Encode(okp) }, sameAccount(ac))
	if err != nil {
		return err
	}
	if o.accounts {
		res.Changes = append(res.Changes, Change{User: "account TOOLBUS", Account: true, What: what})
	}
	res.AccountJWTs[spub], res.AccountJWTs[apub] = sysJWT, accJWT
	if err := issueTenants(tenants, kr, okp, akp, revoked, o.limits, res); err != nil {
		return err
	}
	if o.accounts {
		if res.SystemCreds, err = kr.systemCreds(skp, write); err != nil {
			return err
		}
	}
	cfg := jwtConfig(o, opJWT, spub, res.AccountJWTs)
	res.Config, err = write("auth-jwt.conf", []byte(cfg))
	return err
}

// jwtConfig is auth-jwt.conf: the server settings of o, the operator, the system
// account and the resolver (memory, or full in o.resolverDir) preloaded with the account
// JWTs.
func jwtConfig(o options, opJWT, spub string, accounts map[string]string) string {
	var preload strings.Builder
	for _, pub := range slices.Sorted(maps.Keys(accounts)) {
		fmt.Fprintf(&preload, "  %s: %s\n", pub, accounts[pub])
	}
	layout := ""
	if o.accounts {
		layout = `# The accounts layout: the roles' users in TOOLBUS, each team's executor user in its
# own account (team-<team>), which imports only its tools' subjects, and each bound
# client's user in its own account (client-<name>), which imports only its identities'
# starts, decisions, cancels, answers and reads, with activation tokens of TOOLBUS's
# token-required exports.
`
	}
	resolver := `# The accounts are preloaded into a memory resolver: a reload (kill -HUP) takes new
# preloads, natsjwt.PushAccounts (system.creds, the accounts layout) updates loaded
# accounts without one; a new account needs the reload.
resolver: MEMORY
`
	if o.resolverDir != "" {
		resolver = fmt.Sprintf(`# A full resolver: the server keeps every account JWT in dir (writable by the server;
# keep this file read-only) and takes a new or changed account from a push with
# system.creds ($SYS.REQ.ACCOUNT.<key>.CLAIMS.UPDATE: toolbus admin push, -push), at
# once, with no reload. A reload stores the preload's new accounts but applies no
# changed one: push them. The preload seeds a server started on an empty dir; an
# account removed from the deployment stays in the dir (allow_delete: false).
# In a cluster every node gets a push; a node that was down takes what it missed from
# another node at its next sync (interval): until then it serves its old JWTs, a
# revoked credential or tool included, so the interval is short.
resolver: {
  type: full
  dir: %s
  allow_delete: false
  interval: "10s"
}
`, strconv.Quote(o.resolverDir))
	}
	return fmt.Sprintf(`# Operator/JWT mode for toolbus, written by go run ./deploy/nats/gen: one account
# (TOOLBUS, JetStream enabled), one user per role and one executor user per team, whose
# JWT carries its permissions (permissions.conf; TEAM_EXECUTOR plus the team's tools).
%s# Give each process its <user>.creds file:
#   TOOLBUS_NATS_CREDS=/run/secrets/<user>.creds
# The admin runs toolbus init once.
# Run it with the toolbus binary (kill -HUP reloads it):
#   toolbus server -c auth-jwt.conf -sd /var/lib/toolbus-nats
# It listens on %s (go run ./deploy/nats/gen -listen 0.0.0.0:4222 for other hosts);
# monitoring (/healthz, /varz, /jsz) stays on loopback.
server_name: toolbus-nats-1
listen: %s
http: 127.0.0.1:8222
max_payload: 1MB
# A user JWT carries its permissions and travels in the CONNECT line: the executor's
# is longer than the default limit of 4 KB.
max_control_line: 64KB

jetstream {
  %s
  max_memory_store: 256MB
  max_file_store: 10GB
}

operator: %s
system_account: %s
%sresolver_preload: {
%s}
`, layout, o.listen, o.listen, storeSetting(o), opJWT, spub, resolver, preload.String())
}

// issueUsers writes the .creds of each user whose permissions are new or changed,
// signed by the account signer names (the core, or its team's in the accounts layout), and records the change of every user in res; a changed
// user's old JWT is added to revoked.
func issueUsers(users []User, kr keyring, signer func(User) (nkeys.KeyPair, string), revoked revocations, write func(string, []byte) (string, error), res *Result) error {
	for _, u := range users {
		akp, apub := signer(u)
		res.Creds[u.Name] = filepath.Join(kr.dir, u.Name+".creds")
		old, existed := kr.userJWT(u.Name)
		if existed && old.Issuer == apub && samePermissions(old, u.Perms) {
			res.Changes = append(res.Changes, Change{User: u.Name, What: "unchanged"})
			continue
		}
		what := "new"
		if existed {
			// Its permissions changed. An old JWT that may do more than the new one
			// (a tool revoked) is revoked once the servers load the new account JWT;
			// one that may do less (a tool granted) keeps working, so the team's
			// running processes go on until they take the new credentials.
			what = "changed"
			if narrows(old, u.Perms) {
				revoked.revoke(old)
			}
		}
		creds, err := userCreds(u, akp)
		if err != nil {
			return err
		}
		if _, err = write(u.Name+".creds", creds); err != nil {
			return err
		}
		res.Changes = append(res.Changes, Change{User: u.Name, What: what})
	}
	return nil
}

// userCreds is the credentials file of a new user of the account akp: its JWT, carrying
// u's permissions and signed by the account, and its nkey seed.
func userCreds(u User, akp nkeys.KeyPair) ([]byte, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = u.Name
	uc.Pub.Allow, uc.Pub.Deny = u.Perms.PubAllow, u.Perms.PubDeny
	uc.Sub.Allow, uc.Sub.Deny = u.Perms.SubAllow, u.Perms.SubDeny
	userJWT, err := uc.Encode(akp)
	if err != nil {
		return nil, err
	}
	seed, _ := ukp.Seed()
	return jwt.FormatUserConfig(userJWT, seed)
}
