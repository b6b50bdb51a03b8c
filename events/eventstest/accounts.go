package eventstest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events/accounts"
)

// TeamAPIPrefix is the subject prefix under which a team account of AccountsConf
// imports the core account's JetStream API (TOOLBUS_NATS_API_PREFIX of its executors).
const TeamAPIPrefix = accounts.CoreAPIPrefix

// AccountsConf renders a server configuration of the accounts layout on a random
// loopback port, with JetStream stored under storeDir: the core account (JetStream,
// user core, password core), where the pipeline's roles connect, and the team's account
// (user and password the team's name, no JetStream of its own), which reaches the core
// only through what the generator exports to it (accounts.TeamExports, rendered by
// accounts.ConfAccounts as deploy/nats/gen -accounts renders it).
func AccountsConf(storeDir, team string, tools []string) string {
	return TeamsConf(storeDir, map[string][]string{team: tools})
}

// TeamsConf is AccountsConf for several teams (each with its tools), each team's
// account with the user and password of its name.
func TeamsConf(storeDir string, teams map[string][]string) string {
	return TenantsConf(storeDir, teams, nil)
}

// TenantsConf is TeamsConf with client accounts too: clients maps each client to the
// identities it is bound to (accounts.ClientExports); each team's and client's account
// has the user and password of its name (so team and client names must differ).
func TenantsConf(storeDir string, teams, clients map[string][]string) string {
	user := func(name string) string { return fmt.Sprintf("      {user: %q, password: %q}\n", name, name) }
	users := func(m map[string][]string) map[string]string {
		out := map[string]string{}
		for name := range m {
			out[name] = user(name)
		}
		return out
	}
	l := accounts.Layout{Teams: teams, Clients: clients, CoreUsers: user("core"), TeamUsers: users(teams), ClientUsers: users(clients)}
	return fmt.Sprintf("listen: 127.0.0.1:-1\njetstream { store_dir: %q }\n", storeDir) + l.Conf()
}

// StartTenantsBare starts a server of TenantsConf(teams, clients) for the test (stopped
// when it ends) with no write service: intaketest.StartTenants starts one beside it.
func StartTenantsBare(t testing.TB, teams, clients map[string][]string) *server.Server {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "accounts.conf")
	if err := os.WriteFile(path, []byte(TenantsConf(filepath.Join(dir, "js"), teams, clients)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return StartServer(t, opts)
}

// AccountsOptions writes AccountsConf(team, tools) into dir (its JetStream store under
// dir too) and returns the server options it describes (intaketest.StartAccounts); a
// server whose grants change while it runs is a process (StartAccountsProcess).
func AccountsOptions(dir, team string, tools []string) (*server.Options, error) {
	path := filepath.Join(dir, "accounts.conf")
	if err := os.WriteFile(path, []byte(AccountsConf(filepath.Join(dir, "js"), team, tools)), 0o600); err != nil {
		return nil, fmt.Errorf("eventstest: %w", err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, fmt.Errorf("eventstest: %w", err)
	}
	return opts, nil
}

// Connect connects to srv as user, whose password is its name (the users of
// TenantsConf), for the test (closed when it ends).
func Connect(t testing.TB, srv *server.Server, user string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
