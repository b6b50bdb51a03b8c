package natsjwt_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/eventstest"
)

// dial connects user as the deployment's kind of credentials, returning the error.
func (d *accountsDeployment) dial(user string) (*nats.Conn, error) {
	d.t.Helper()
	nc, err := nats.Connect(d.srv.ClientURL(), d.kind.auth(d.t, d.res, user), nats.Timeout(5*time.Second), nats.NoReconnect())
	if err == nil {
		d.t.Cleanup(nc.Close)
	}
	return nc, err
}

// echo checks that nc, inside its own account, subscribes, publishes and hears itself.
func echo(t *testing.T, who string, nc *nats.Conn) {
	t.Helper()
	subj := "limits.echo." + strings.NewReplacer(".", "_", "-", "_").Replace(who)
	sub, err := nc.SubscribeSync(subj)
	if err != nil {
		t.Fatalf("%s subscribes: %v", who, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Publish(subj, []byte(who)); err != nil {
		t.Fatalf("%s publishes: %v", who, err)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("%s does not hear itself: %v (last error %v)", who, err, nc.LastError())
	}
}

// The tenant limits of the accounts layout, in each kind of credentials, on the real
// server: a team's and a client's account hold at most Conns connections (one more is
// refused with the server's "maximum account active connections exceeded", and one
// fits again once one closes) and a connection of theirs at most Subs subscriptions
// (one more is refused with "maximum subscriptions exceeded"), while the other team,
// the other client and the core's roles still connect and work.
func TestTenantLimits(t *testing.T) {
	const conns, subs = 3, 50
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}, "beta": {"other"}},
		Clients: map[string][]string{"alice": {"alice"}, "bob": {"bob"}}}
	res := generateAccounts(t, g, natsjwt.WithTenantLimits(accounts.TenantLimits{Conns: conns, Subs: subs}))
	tenants := []struct{ user, other string }{
		{natsjwt.TeamUser("alpha"), natsjwt.TeamUser("beta")},
		{natsjwt.ClientUser("alice"), natsjwt.ClientUser("bob")},
	}
	for _, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := eventstest.Context(t, time.Minute)
			d := startAccounts(t, ctx, kind, res, "calc", "other")
			for _, tn := range tenants {
				var held []*nats.Conn
				for i := range conns {
					nc, err := d.dial(tn.user)
					if err != nil {
						t.Fatalf("%s's connection %d of %d: %v", tn.user, i+1, conns, err)
					}
					held = append(held, nc)
				}
				if _, err := d.dial(tn.user); err == nil || !strings.Contains(err.Error(), "maximum account active connections exceeded") {
					t.Fatalf("%s's connection %d (cap %d): %v, want the server's maximum account active connections exceeded", tn.user, conns+1, conns, err)
				}
				// The other tenant and the core are not starved.
				echo(t, tn.other, d.conn(tn.other))
				if err := d.conn("planner").Flush(); err != nil {
					t.Fatalf("planner: %v", err)
				}
				d.put(events.SubjectRunEnded("limits-run", "completed"), `{"core":"still writes"}`)

				// Subscriptions: a connection holds subs, the next is refused, the
				// connection stays and its subscriptions work.
				nc := held[0]
				for i := range subs {
					if _, err := nc.SubscribeSync(fmt.Sprintf("limits.sub.%d", i)); err != nil {
						t.Fatal(err)
					}
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				if err := nc.LastError(); err != nil {
					t.Fatalf("%s's %d subscriptions (cap %d): %v", tn.user, subs, subs, err)
				}
				if _, err := nc.SubscribeSync("limits.sub.over"); err != nil {
					t.Fatal(err)
				}
				eventstest.Eventually(t, 5*time.Second, func() error {
					_ = nc.Flush()
					if err := nc.LastError(); !errors.Is(err, nats.ErrMaxSubscriptionsExceeded) {
						return fmt.Errorf("%s's subscription %d (cap %d) is not refused with maximum subscriptions exceeded: %v", tn.user, subs+1, subs, err)
					}
					return nil
				})
				if nc.IsClosed() {
					t.Fatalf("%s's connection closed on its refused subscription", tn.user)
				}
				echo(t, tn.other, d.conn(tn.other))

				// A connection closed makes room for one.
				for _, c := range held {
					c.Close()
				}
				eventstest.Eventually(t, 10*time.Second, func() error {
					nc, err := d.dial(tn.user)
					if err != nil {
						return fmt.Errorf("%s cannot connect once its connections closed: %w", tn.user, err)
					}
					echo(t, tn.user, nc)
					nc.Close()
					return nil
				})
			}
		})
	}
}

// pullCall takes one call of tool's queue as a team's executors do: a pull, no consumer
// info (the core exports none to a team, events/teamqueue). It returns the call, or
// why there is none: nats.ErrNoResponders when the queue is not reachable with nc's
// credentials, the pull's status otherwise.
func pullCall(nc *nats.Conn, tool string, wait time.Duration) (*nats.Msg, error) {
	subject := natsjwt.CoreAPIPrefix + ".CONSUMER.MSG.NEXT." + events.QueueStreamName(events.DefaultStream) + "." + events.ToolConsumer(tool)
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, []byte(fmt.Sprintf(`{"batch":1,"expires":%d}`, wait.Nanoseconds()))); err != nil {
		return nil, err
	}
	m, err := sub.NextMsg(wait + 2*time.Second)
	switch {
	case err != nil:
		return nil, err
	case m.Header.Get("Status") == "503":
		return nil, nats.ErrNoResponders
	case m.Header.Get("Status") != "":
		return nil, fmt.Errorf("pull of %s: %s %s", tool, m.Header.Get("Status"), m.Header.Get("Description"))
	}
	return m, nil
}
