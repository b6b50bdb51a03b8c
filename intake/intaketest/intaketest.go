// Package intaketest starts the accounts layout's test servers with the core's write
// service (package intake) beside them. It lives above intake, so that the server
// helpers of events/eventstest, below intake, import nothing of it.
package intaketest

import (
	"context"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/intake"
)

// StartTeams starts a server of eventstest.TeamsConf(teams) for the test (stopped when
// it ends).
func StartTeams(t testing.TB, teams map[string][]string) *server.Server {
	t.Helper()
	return StartTenants(t, teams, nil)
}

// StartTenants starts a server of eventstest.TenantsConf(teams, clients) for the test
// (stopped when it ends), with the core's write service (StartIntake) beside it.
func StartTenants(t testing.TB, teams, clients map[string][]string) *server.Server {
	t.Helper()
	return StartTenantsLimited(t, teams, clients, intake.Limits{})
}

// StartTenantsLimited is StartTenants whose write service bounds each tenant by lim.
func StartTenantsLimited(t testing.TB, teams, clients map[string][]string, lim intake.Limits) *server.Server {
	t.Helper()
	srv := eventstest.StartTenantsBare(t, teams, clients)
	ServeIntake(t, eventstest.Connect(t, srv, "core"), lim)
	return srv
}

// StartIntake runs the core's write service (package intake, which every injector
// runs) on srv as user core until the test ends: in the accounts layout a tenant's
// writes reach the core's streams only through it.
func StartIntake(t testing.TB, srv *server.Server) {
	t.Helper()
	ServeIntake(t, eventstest.Connect(t, srv, "core"), intake.Limits{})
}

// ServeIntake runs the core's write service on nc (a connection of the core account,
// such as the generated injector's) with lim until the test ends, and returns it.
func ServeIntake(t testing.TB, nc *nats.Conn, lim intake.Limits) *intake.Service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	svc := intake.New(nc, lim, nil)
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("intaketest: intake: %v", err)
		}
	})
	return svc
}

// StartAccounts starts a server of eventstest.AccountsConf(team, tools) for the test
// (stopped when it ends), with the write service beside it; users core/core and
// team/team connect to its ClientURL.
func StartAccounts(t testing.TB, team string, tools []string) *server.Server {
	t.Helper()
	opts, err := eventstest.AccountsOptions(t.TempDir(), team, tools)
	if err != nil {
		t.Fatal(err)
	}
	srv := eventstest.StartServer(t, opts)
	StartIntake(t, srv)
	return srv
}
