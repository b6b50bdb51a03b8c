package natsjwt_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/fair"
	"github.com/toolbus/toolbus/reads"
)

// The set-ups the probe tests share: one home, so that a probe test says only what it
// probes.

// startOutsiders starts the deployment an outsider probes: the accounts layout with teams
// alpha (calc) and beta (search) and each of clients bound to its own identity, in the
// JWT kind, the core set up for both tools and its write service running.
func startOutsiders(t *testing.T, clients ...string) (context.Context, *accountsDeployment) {
	t.Helper()
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}, "beta": {"search"}}}
	for _, c := range clients {
		if g.Clients == nil {
			g.Clients = map[string][]string{}
		}
		g.Clients[c] = []string{c}
	}
	ctx := eventstest.Context(t, 2*time.Minute)
	return ctx, startAccounts(t, ctx, credKinds[0], generateAccounts(t, g), "calc", "search")
}

// generateAccounts generates g's credentials in the accounts layout (and opts) in a
// directory of the test's, at the cheapest password hashing.
func generateAccounts(t *testing.T, g natsjwt.Grants, opts ...natsjwt.Option) natsjwt.Result {
	t.Helper()
	opts = append([]natsjwt.Option{natsjwt.WithAccounts(), natsjwt.WithBcryptCost(bcrypt.MinCost)}, opts...)
	res, err := natsjwt.GenerateGrants(filepath.Join("..", "permissions.conf"), t.TempDir(), g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// coreBus is the core's bus, set up by the administrator with cfg for both tools.
func (d *accountsDeployment) coreBus(cfg events.Config, opts ...provision.Option) *events.Bus {
	d.t.Helper()
	opts = append([]provision.Option{provision.WithTools([]string{"calc", "search"}, 0, 0)}, opts...)
	bus, _, err := provision.Setup(d.ctx, d.conn("admin"), cfg, opts...)
	if err != nil {
		d.t.Fatal(err)
	}
	return bus
}

// runReads runs the core's read service on bus until the test ends.
func runReads(t *testing.T, ctx context.Context, bus *events.Bus) {
	t.Helper()
	rctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- reads.New(bus, nil).Serve(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("reads: %v", err)
		}
	})
}

// runScheduler runs the core's fair scheduler on bus, one call of a tenant's at a time,
// until the test ends.
func runScheduler(t *testing.T, ctx context.Context, bus *events.Bus) {
	t.Helper()
	sched, err := fair.New(ctx, bus, fair.Shares{Cap: 1}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sched.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
}

// reachesNothing checks one probe of who's: its request on subject reaches nothing of
// the core (no responders, no answer, or its own account's error, which carries nothing
// of the core), and where stream names where a write would land, the core stored no
// write of the probe's (it sends probeMark) under stored.
func (d *accountsDeployment) reachesNothing(nc *nats.Conn, who, name, subject, body, stream, stored string) {
	t := d.t
	t.Helper()
	if stream != "" {
		body = `{"x":"` + probeMark + `"}`
	}
	c, cancel := context.WithTimeout(d.ctx, time.Second)
	m, err := nc.RequestWithContext(c, subject, []byte(body))
	cancel()
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, context.DeadlineExceeded):
	case err == nil && strings.Contains(string(m.Data), `"error"`) && !strings.Contains(string(m.Data), "secret"):
		// who's own account answered (it has no JetStream): nothing of the core.
	default:
		t.Errorf("%s: %s reached %s: %v %q", name, who, subject, err, dataOf(m))
	}
	if stream != "" && d.stored(stream, stored) {
		t.Errorf("%s: %s's write to %s was stored in the core", name, who, subject)
	}
}

// noConsumerCreated checks that who's consumer creates (durable "evil") made none in the
// core's stream.
func (d *accountsDeployment) noConsumerCreated(who string) {
	d.t.Helper()
	if s, err := d.core.Stream(d.ctx, events.DefaultStream); err != nil {
		d.t.Fatal(err)
	} else if _, err := s.Consumer(d.ctx, "evil"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		d.t.Errorf("%s created a consumer in the core: %v", who, err)
	}
}
