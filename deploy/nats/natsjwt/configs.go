package natsjwt

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/toolbus/toolbus/events/accounts"
)

// writeConfigKinds writes the user/password and nkey kinds (auth-users.conf and
// auth-nkeys.conf, the same users with their permissions inline, and in the accounts
// layout in their accounts) and k8s-secrets.yaml, with the server settings single.
func writeConfigKinds(users []User, g Grants, o options, kr keyring, single string, write func(string, []byte) (string, error), res *Result) error {
	var pwUsers, nkUsers, secrets strings.Builder
	// In the accounts layout a team's or client's users go into its account's block.
	pw := accounts.Layout{Teams: g.Teams, Clients: g.Clients, TeamUsers: map[string]string{}, ClientUsers: map[string]string{}, Limits: o.limits, ResponseThreshold: o.respThreshold}
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
