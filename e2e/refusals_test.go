package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
)

// Refusals explain themselves: with the credentials deploy/nats/gen issues, in each
// kind, an operation the server refuses ends as a *connect.PermissionError that names
// the credentials, the subject and the missing grant, never as the request's timeout
// (the operations below run under a context that would time out only after a minute,
// and the error must not be a deadline): an executor whose TOOLBUS_TEAM is not its
// credentials' team, a team offering a tool not granted to it, a client bound to alice
// starting a run for bob, `toolbus init` with a team's credentials.
func TestRefusalsNameTheGrant(t *testing.T) {
	t.Parallel()
	perms := filepath.Join("..", "deploy", "nats", "permissions.conf")
	grants := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calculator"}, "beta": {"noop"}},
		Clients: map[string][]string{"alice": {"alice"}}}
	for _, mode := range genModes() {
		t.Run(mode.name, func(t *testing.T) {
			res, err := natsjwt.GenerateGrants(perms, t.TempDir(), grants, natsjwt.WithBcryptCost(bcrypt.MinCost))
			if err != nil {
				t.Fatal(err)
			}
			srv := startConfigured(t, mode.conf(res), nil)
			ctx := eventstest.Context(t, 3*time.Minute)
			open := func(user string) *events.Bus {
				nc, err := connectAs(t, srv.ClientURL(), user, nil, mode.opt(t, res, user))
				if err != nil {
					t.Fatalf("%s connects: %v", user, err)
				}
				if user == "admin" {
					b, _, err := provision.Setup(ctx, nc, events.Config{}, provision.WithTools([]string{"calculator", "noop"}, 30*time.Second, 100))
					if err != nil {
						t.Fatal(err)
					}
					return b
				}
				b, err := events.Open(ctx, nc, events.Config{})
				if err != nil {
					t.Fatalf("%s opens the bus: %v", user, err)
				}
				return b
			}
			open("admin")
			// refused checks err: a permission error naming the credentials of user, the
			// subject and the hint, not a timeout.
			refused := func(what string, err error, user, subject, hint string) {
				t.Helper()
				var pe *connect.PermissionError
				if !errors.As(err, &pe) {
					t.Fatalf("%s: %v, want a *connect.PermissionError", what, err)
				}
				if errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%s: the refusal waited for a timeout: %v", what, err)
				}
				msg := err.Error()
				if mode.name != "nkeys" && !strings.Contains(msg, "user "+user) {
					t.Errorf("%s: %q does not name the credentials (user %s)", what, msg, user)
				}
				if !strings.Contains(msg, subject) || !strings.Contains(msg, hint) {
					t.Errorf("%s: %q does not name the subject %q and the grant %q", what, msg, subject, hint)
				}
			}
			long := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Minute) }

			// An executor of beta's credentials that says it is alpha's.
			betaUser := natsjwt.TeamUser("beta")
			beta := open(betaUser)
			reg := executor.NewRegistry()
			noop := executor.Tool{Name: "noop", Description: "nothing", InputSchema: json.RawMessage(`{"type":"object"}`),
				Func: func(context.Context, json.RawMessage) (any, error) { return "ok", nil }}
			calc := noop
			calc.Name = "calculator"
			for _, tool := range []executor.Tool{noop, calc} {
				if err := reg.Register(tool); err != nil {
					t.Fatal(err)
				}
			}
			runWorker := func(team string, tools ...string) error {
				w, err := worker.New(beta, must(executor.New(reg)), worker.Config{
					WorkerConfig: workerconfig.WorkerConfig{Instance: "beta-" + team, Grace: time.Second}, Tools: tools, Team: team})
				if err != nil {
					t.Fatal(err)
				}
				wctx, cancel := long()
				defer cancel()
				return w.Run(wctx)
			}
			refused("team mismatch", runWorker("alpha", "noop"), betaUser, "$KV.toolbus_instances.alpha.", "TOOLBUS_TEAM")
			// beta serving alpha's calculator: its own heartbeat passes, the catalog entry is refused.
			refused("tool not granted", runWorker("beta", "calculator"), betaUser, "$KV.toolbus_tools.calculator", `tool "calculator" is not granted`)

			// A client bound to alice starting a run for bob.
			aliceUser := natsjwt.ClientUser("alice")
			alice := open(aliceUser)
			sctx, cancel := long()
			err = alice.StartRun(sctx, events.Source("cli", "t"), toolbus.RunStarted{RunID: "refused-bob", Principal: toolbus.Principal{ID: "bob"},
				Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "go"}}})
			cancel()
			refused("unbound principal", err, aliceUser, "toolbus.refused-bob.run.started.bob", `principal "bob"`)

			// toolbus init with a team's credentials.
			nc, err := connectAs(t, srv.ClientURL(), betaUser, nil, mode.opt(t, res, betaUser))
			if err != nil {
				t.Fatal(err)
			}
			ictx, cancel := long()
			_, _, err = provision.Setup(ictx, nc, events.Config{}, provision.WithTools([]string{"noop"}, 30*time.Second, 100))
			cancel()
			refused("init without admin", err, betaUser, "$JS.API.", "only the admin's credentials")
		})
	}
}
