package events_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// TestTeamAccountSecrets: on the accounts layout as the generator renders it
// (accounts.TeamExports; per team: $KV.toolbus_secrets.<team>.> and the direct gets of
// $KV.toolbus_secrets.<team>.> under JS.core.API), a team's executor writes and reads
// its own keys with compare-and-set from its account, and reaches no other team's:
// beta's token stays unread and unchanged.
func TestTeamAccountSecrets(t *testing.T) {
	srv := intaketest.StartTeams(t, map[string][]string{"alpha": nil, "beta": nil})
	ctx := eventstest.Context(t, time.Minute)
	connect := func(user string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	core, _, err := provision.Setup(ctx, connect("core"), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	coreBeta, err := core.Secrets(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := coreBeta.Swap(ctx, "tok", []byte("beta-token"), 0); err != nil || !ok {
		t.Fatalf("the core writes beta's secret: %v %v", ok, err)
	}

	alphaBus, err := events.Open(ctx, connect("alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	alpha, err := alphaBus.Secrets(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	rev, ok, err := alpha.Swap(ctx, "tok", []byte("alpha-1"), 0)
	if err != nil || !ok {
		t.Fatalf("alpha creates its secret: %v %v", ok, err)
	}
	if _, ok, err := alpha.Swap(ctx, "tok", []byte("alpha-x"), 0); err != nil || ok {
		t.Fatalf("alpha's second create: swapped %v, %v (want lost)", ok, err)
	}
	if _, ok, err := alpha.Swap(ctx, "tok", []byte("alpha-2"), rev); err != nil || !ok {
		t.Fatalf("alpha updates on its revision: %v %v", ok, err)
	}
	if v, _, err := alpha.Load(ctx, "tok"); err != nil || string(v) != "alpha-2" {
		t.Fatalf("alpha reads its secret: %q, %v", v, err)
	}

	stolen, err := alphaBus.Secrets(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	if v, _, err := stolen.Load(ctx, "tok"); err == nil {
		t.Fatalf("alpha read beta's secret: %q", v)
	}
	if _, ok, err := stolen.Swap(ctx, "tok", []byte("alpha-was-here"), 0); err == nil || ok {
		t.Fatalf("alpha wrote beta's secret: swapped %v, %v", ok, err)
	}
	if v, _, err := coreBeta.Load(ctx, "tok"); err != nil || string(v) != "beta-token" {
		t.Fatalf("beta's secret: %q, %v (want it unchanged)", v, err)
	}
}
