package events_test

import (
	"errors"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
)

// An instance that stops heartbeating leaves the catalog by the bucket's TTL (the
// server's delete marker), and its tools are no longer offered.
func TestInstanceExpiresFromCatalog(t *testing.T) {
	b := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, time.Minute)
	bus, _, err := events.Setup(ctx, b.Conn, events.Config{InstanceTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.PublishTool(ctx, toolbus.ToolContract{Name: "solo"}); err != nil {
		t.Fatal(err)
	}
	cat, err := bus.WatchCatalog(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.PutInstance(ctx, events.Instance{Name: "only/one", Tools: []string{"solo"}}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		if len(cat.Tools(nil)) != 1 {
			return errors.New("tool of a live instance not offered")
		}
		return nil
	})
	if alive, err := bus.InstanceAlive(ctx, "only/one"); err != nil || !alive {
		t.Fatalf("alive %v, %v", alive, err)
	}
	// No more heartbeats: gone within the TTL (plus the server's expiry tick).
	eventstest.Eventually(t, 30*time.Second, func() error {
		if got := cat.Tools(nil); len(got) != 0 {
			return errors.New("tool of a dead instance still offered")
		}
		return nil
	})
	if alive, err := bus.InstanceAlive(ctx, "only/one"); err != nil || alive {
		t.Fatalf("expired instance alive %v, %v", alive, err)
	}
	if _, ok := cat.Lookup("solo"); !ok {
		t.Fatal("the contract itself must stay known (calls to it are routed to its queue)")
	}
}

func TestClaims(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	a := events.Claim{Instance: "a", Attempt: 1}
	if _, _, err := bus.ClaimCall(ctx, "r1", 0, "call.1", a); err != nil {
		t.Fatal(err)
	}
	cur, rev, err := bus.ClaimCall(ctx, "r1", 0, "call.1", events.Claim{Instance: "b", Attempt: 2})
	if !errors.Is(err, events.ErrClaimed) || cur.Instance != "a" || rev == 0 {
		t.Fatalf("second claim: %+v %d %v", cur, rev, err)
	}
	// The same call id at another step is another call.
	if _, _, err := bus.ClaimCall(ctx, "r1", 1, "call.1", events.Claim{Instance: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := bus.TakeOverClaim(ctx, "r1", 0, "call.1", events.Claim{Instance: "b", Attempt: 2}, rev); err != nil {
		t.Fatal(err)
	}
	// A second taker with the old revision loses.
	if err := bus.TakeOverClaim(ctx, "r1", 0, "call.1", events.Claim{Instance: "c", Attempt: 2}, rev); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("stale take-over: %v", err)
	}
	cur, _, _ = bus.ClaimCall(ctx, "r1", 0, "call.1", events.Claim{Instance: "d"})
	if cur.Instance != "b" {
		t.Fatalf("claim held by %q, want b", cur.Instance)
	}
}
