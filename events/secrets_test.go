package events_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// TestSecretsCompareAndSet: the secrets of a team are created once (a second create
// loses), updated on their revision only, and kept apart from another team's keys.
// Credentials without the secrets grant fail at once with a *connect.PermissionError,
// not on a timeout, so an executor renews its tokens alone without waiting.
func TestSecretsCompareAndSet(t *testing.T) {
	all := &server.SubjectPermission{Allow: []string{">"}}
	srv := eventstest.StartServer(t, &server.Options{JetStream: true, Users: []*server.User{
		{Username: "admin", Password: "a"},
		{Username: "other", Password: "o", Permissions: &server.Permissions{Subscribe: all,
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.DIRECT.GET.KV_toolbus_secrets.>", "$KV.toolbus_secrets.>"}}}},
	}})
	ctx := eventstest.Context(t, time.Minute)
	admin, err := nats.Connect(srv.ClientURL(), nats.UserInfo("admin", "a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	bus, _, err := provision.Setup(ctx, admin, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := bus.Secrets(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.Secrets(ctx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	rev, ok, err := a.Swap(ctx, "tok", []byte("v1"), 0)
	if err != nil || !ok {
		t.Fatalf("create: %v %v", ok, err)
	}
	if _, ok, err := a.Swap(ctx, "tok", []byte("v1'"), 0); err != nil || ok {
		t.Fatalf("a second create: swapped %v, %v (want lost)", ok, err)
	}
	if _, ok, err := a.Swap(ctx, "tok", []byte("v2"), rev+100); err != nil || ok {
		t.Fatalf("an update on a wrong revision: swapped %v, %v (want lost)", ok, err)
	}
	if _, ok, err := a.Swap(ctx, "tok", []byte("v2"), rev); err != nil || !ok {
		t.Fatalf("an update on its revision: swapped %v, %v", ok, err)
	}
	if v, _, err := a.Load(ctx, "tok"); err != nil || string(v) != "v2" {
		t.Fatalf("load: %q, %v", v, err)
	}
	if v, r, err := b.Load(ctx, "tok"); err != nil || v != nil || r != 0 {
		t.Fatalf("team-b reads team-a's key: %q rev %d, %v", v, r, err)
	}

	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("other", "o"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ob, err := events.Open(ctx, nc, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	denied, err := ob.Secrets(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	// Ended by the refusal, not by the deadline.
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var pe *connect.PermissionError
	if _, _, err := denied.Load(octx, "tok"); !errors.As(err, &pe) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read without the grant: %v, want a *connect.PermissionError before the deadline", err)
	}
	if _, _, err := denied.Swap(octx, "tok", []byte("x"), 0); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a write without the grant: %v, want a refusal before the deadline", err)
	}
}
