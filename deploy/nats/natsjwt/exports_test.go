package natsjwt_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// Exports are exact (issue 54), in each kind of credentials on the real server. The core
// holds everything it holds in a deployment (the stream and its read mirror, the queue
// stream, every bucket, the planner's and the injector's durables, each tool's queue, a
// bucket watcher, the write and the read services); every subscription of the core
// account is enumerated with the server's own Subsz (its internal ones too), and no
// service the core exports, nor any tenant's import of it, as the server loaded them,
// may match one it is not meant for (accounts.Crossing.For). The check catches each
// widened pattern of the table (the acknowledgement import before issue 54 among them).
//
// The attack of issue 54 with team alpha's credentials: "+NXT" on another consumer's
// ack subject, in both of the server's shapes and through alpha's ack imports, gets
// nothing, and the message is still there: the core's "+NXT" on the injector's durable
// gets the client's start, beta's on its own queue gets its call (the controls), and
// alpha's own "+NXT" on its own queue, in both shapes, gets its calls.
func TestExportsAreExact(t *testing.T) {
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}, "beta": {"search"}}, Clients: map[string][]string{"alice": {"alice"}}}
	res := generateAccounts(t, g)
	var tenants []accounts.Crossing
	for team, tools := range g.Teams {
		tenants = append(tenants, accounts.TeamExports(team, tools)...)
	}
	for _, ids := range g.Clients {
		tenants = append(tenants, accounts.ClientExports(ids)...)
	}
	layout := append(accounts.CoreExports(), tenants...)
	for _, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := eventstest.Context(t, time.Minute)
			d := startAccounts(t, ctx, kind, res, "calc", "search")
			core := natsjwt.CoreAccount
			if kind.name == "jwt" {
				core = res.Account
			}
			holdEverything(t, ctx, d)
			// Every tenant connects: the JWT kind loads an account (its imports) then.
			for team := range g.Teams {
				d.conn(natsjwt.TeamUser(team))
			}
			for c := range g.Clients {
				d.conn(natsjwt.ClientUser(c))
			}
			subs := eventstest.Subscriptions(t, d.srv, core)
			crossings := eventstest.ServiceCrossings(t, d.srv, core, layout)
			for _, c := range tenants {
				if !c.Stream && !slices.ContainsFunc(crossings, func(h accounts.Crossing) bool { return h.Subject == c.Subject }) {
					t.Errorf("the server holds no import of %s: the check would not see it", c.Subject)
				}
			}
			checkExact(t, core, crossings, subs)
			ackAttack(t, d, core)
		})
	}
}

// holdEverything has the core hold what a deployment's core holds beyond startAccounts'
// setup, and waits until the server lists the services' and the watcher's subscriptions.
func holdEverything(t *testing.T, ctx context.Context, d *accountsDeployment) {
	t.Helper()
	runReads(t, ctx, d.coreBus(events.Config{}, provision.WithReadMirror()))
	kv, err := d.core.KeyValue(ctx, "toolbus_tools")
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	eventstest.Eventually(t, 30*time.Second, func() error {
		subs := eventstest.Subscriptions(t, d.srv, coreName(d))
		for _, want := range []string{events.WriteServicePrefix + ".>", events.ReadServicePrefix + ".*.>", events.ToolReadPrefix + ".*.question", events.FollowServicePrefix + ".*.*", events.TeamReadPrefix + ".*.>", "$JS.FC."} {
			if !slices.ContainsFunc(subs, func(s string) bool { return strings.HasPrefix(s, want) }) {
				return fmt.Errorf("the core holds no subscription %s yet", want)
			}
		}
		return nil
	})
}

func coreName(d *accountsDeployment) string {
	if d.kind.name == "jwt" {
		return d.res.Account
	}
	return natsjwt.CoreAccount
}

// checkExact checks the crossings the server holds against the core's subscriptions,
// and that the check catches widened ones.
func checkExact(t *testing.T, core string, crossings []accounts.Crossing, subs []string) {
	t.Helper()
	// The check knows every subscription nats-server makes for JetStream in the core (its
	// shapes are read from the server's code, the v2 hash computed as the server does):
	// else a colliding one would fail as unknown, but a silent drift would go unseen.
	for _, s := range subs {
		if strings.HasPrefix(s, "$JS.ACK.") || strings.HasPrefix(s, "$JS.FC.") || strings.HasPrefix(s, "$JS.API.CONSUMER.") || strings.HasPrefix(s, "$JS.API.DIRECT.") {
			if _, ok := eventstest.SubscriptionOwner(s, core, ""); !ok {
				t.Errorf("the check does not know the server's subscription %s", s)
			}
		}
	}
	for _, durable := range []string{"planner", "injector-started", "injector-timers"} {
		for _, want := range []string{"$JS.ACK.TOOLBUS." + durable + ".*.*.*.*.*", "$JS.ACK._." + eventstest.AckHash(core) + ".TOOLBUS." + durable + ".*.*.*.*.>"} {
			if !slices.Contains(subs, want) {
				t.Errorf("the core holds no %s", want)
			}
		}
	}
	for _, c := range eventstest.ExportCollisions(crossings, subs, core, "") {
		t.Error(c)
	}

	queue := accounts.Target{Kind: accounts.ForConsumer, Name: "TOOLBUS_QUEUES.tool_calc"}
	for _, w := range []struct {
		name    string
		c       accounts.Crossing
		reaches string // a subscription the widened crossing must be caught reaching
	}{
		{"the ack import before issue 54 (v2 with free tokens)", accounts.Crossing{Subject: "$JS.ACK.*.*.TOOLBUS_QUEUES.tool_calc.>", For: queue}, "$JS.ACK.TOOLBUS.injector-started.*.*.*.*.*"},
		{"every ack", accounts.Crossing{Subject: "$JS.ACK.>", For: queue}, "$JS.ACK.TOOLBUS.planner.*.*.*.*.*"},
		{"every queue's ack", accounts.Crossing{Subject: "$JS.ACK.TOOLBUS_QUEUES.*.*.*.*.*.*", For: queue}, "$JS.ACK.TOOLBUS_QUEUES.tool_search.*.*.*.*.*"},
		{"any consumer request", accounts.Crossing{Subject: "$JS.API.CONSUMER.*.TOOLBUS_QUEUES.tool_calc", For: accounts.Target{Kind: accounts.ForAPI, Name: "$JS.API.CONSUMER.INFO.*.*"}}, "$JS.API.CONSUMER.RESET.TOOLBUS_QUEUES.tool_calc"},
		{"any bucket's direct gets", accounts.Crossing{Subject: "$JS.API.DIRECT.GET.*.$KV.toolbus_claims.calc.>", For: accounts.Target{Kind: accounts.ForDirect, Name: "KV_toolbus_claims"}}, "$JS.API.DIRECT.GET.KV_toolbus_secrets.>"},
		{"any service of alpha's", accounts.Crossing{Subject: "*.team.alpha.>", For: accounts.Target{Kind: accounts.ForWrites}}, events.ReadServicePrefix + ".*.>"},
	} {
		found := eventstest.ExportCollisions([]accounts.Crossing{w.c}, subs, core, "")
		if !slices.ContainsFunc(found, func(s string) bool { return strings.Contains(s, " "+w.reaches+",") }) {
			t.Errorf("%s: the check does not catch %s reaching %s: %q", w.name, w.c.Subject, w.reaches, found)
		}
	}
}

// ackAttack is issue 54's first hole, tried with alpha's credentials: "+NXT" on the ack
// subjects of the injector's durable of starts and of beta's queue.
func ackAttack(t *testing.T, d *accountsDeployment, core string) {
	t.Helper()
	d.put(events.SubjectRunStarted("r1", "alice"), `{"secret":"alice's prompt"}`)
	for _, tool := range []string{"calc", "search"} {
		for _, run := range []string{"r1", "r2"} {
			d.put(events.SubjectToolRequested(run, tool), `{"secret":"`+tool+` args `+run+`"}`)
		}
	}
	alpha, _ := d.team("alpha")
	beta, _ := d.team("beta")
	const next = `+NXT {"batch":1}`
	hash := eventstest.AckHash(core)
	// nxt sends "+NXT" on subject as nc and returns the message the server hands back, or
	// nil when none comes within wait.
	nxt := func(nc *nats.Conn, subject string, wait time.Duration) *nats.Msg {
		t.Helper()
		if got := askWithin(t, nc, subject, next, wait); len(got) > 0 {
			return got[0]
		}
		return nil
	}
	for _, subject := range []string{
		// The v1 shape of the injector's durable and of beta's queue, through alpha's v2
		// ack import as it was.
		"$JS.ACK.TOOLBUS." + events.ConsumerInjectorStarted + ".TOOLBUS_QUEUES.tool_calc.1.1.1",
		"$JS.ACK.TOOLBUS_QUEUES.tool_search.TOOLBUS_QUEUES.tool_calc.1.1.1",
		// Their v2 shape.
		"$JS.ACK._." + hash + ".TOOLBUS." + events.ConsumerInjectorStarted + ".0.0.0.0.0",
		"$JS.ACK._." + hash + ".TOOLBUS_QUEUES.tool_search.0.0.0.0.0",
		// Their v1 shape, directly.
		"$JS.ACK.TOOLBUS." + events.ConsumerInjectorStarted + ".0.0.0.0.0",
		"$JS.ACK.TOOLBUS_QUEUES.tool_search.0.0.0.0.0",
	} {
		if m := nxt(alpha, subject, time.Second); m != nil {
			t.Errorf("alpha's +NXT on %s was handed %s: %s", subject, m.Subject, m.Data)
		}
	}
	// The controls: the messages were there to take, and are still.
	want := func(who string, m *nats.Msg, subject string) {
		t.Helper()
		if m == nil || m.Subject != subject && events.CallSubject(m.Subject, m.Header) != subject {
			t.Errorf("%s's +NXT was not handed %s: %v", who, subject, m)
		}
	}
	want("the core", nxt(d.core.Conn(), "$JS.ACK.TOOLBUS."+events.ConsumerInjectorStarted+".0.0.0.0.0", 10*time.Second), events.SubjectRunStarted("r1", "alice"))
	want("beta", nxt(beta, "$JS.ACK.TOOLBUS_QUEUES.tool_search.0.0.0.0.0", 10*time.Second), events.SubjectToolRequested("r1", "search"))
	want("alpha (v1)", nxt(alpha, "$JS.ACK.TOOLBUS_QUEUES.tool_calc.0.0.0.0.0", 10*time.Second), events.SubjectToolRequested("r1", "calc"))
	want("alpha (v2)", nxt(alpha, "$JS.ACK._."+hash+".TOOLBUS_QUEUES.tool_calc.0.0.0.0.0", 10*time.Second), events.SubjectToolRequested("r2", "calc"))
}
