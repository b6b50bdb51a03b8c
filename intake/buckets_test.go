package intake_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// TestTenantSecretsAreBounded: the secrets bucket is shared by every team and bounded
// for all of them (here 16 KiB). Team alpha fills it with its own keys of 1 KiB: the
// write service refuses its fifth key (store_full, 507, events.ErrTenantStoreFull: its
// bound is 4 keys), while its writes under the bound (the control) and a renewal of a
// key it holds pass, and team beta, writing afterwards, still creates and renews its
// OAuth token. Without the bound alpha's keys take the whole bucket and beta's renewal
// fails with "maximum bytes exceeded".
func TestTenantSecretsAreBounded(t *testing.T) {
	srv := eventstest.StartTenantsBare(t, map[string][]string{"alpha": nil, "beta": nil}, nil)
	ctx := eventstest.Context(t, time.Minute)
	core := eventstest.Connect(t, srv, "core")
	intaketest.ServeIntake(t, core, intake.Limits{Buckets: map[string]intake.BucketBound{store.BucketSecrets: {Keys: 4, ValueBytes: 2048}}})
	if _, _, err := provision.Setup(ctx, core, events.Config{}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: store.BucketSecrets, History: 1,
		MaxBytes: 16 << 10, MaxValueSize: provision.SecretsMaxValueSize}); err != nil {
		t.Fatal(err)
	}
	secrets := func(team string) *store.Secrets {
		bus, err := events.Open(ctx, eventstest.Connect(t, srv, team), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
		if err != nil {
			t.Fatal(err)
		}
		s, err := bus.Secrets(ctx, team)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	alpha, beta := secrets("alpha"), secrets("beta")
	value := []byte(strings.Repeat("s", 1024))
	var (
		stored int
		full   error
		rev0   uint64
	)
	for i := 0; i < 32 && full == nil; i++ {
		rev, ok, err := alpha.Swap(ctx, "key"+string(rune('a'+i)), value, 0)
		switch {
		case err != nil:
			full = err
		case !ok:
			t.Fatalf("alpha's new key %d lost a race nobody ran", i)
		default:
			stored++
			if i == 0 {
				rev0 = rev
			}
		}
	}
	if stored != 4 || !errors.Is(full, events.ErrTenantStoreFull) || !strings.Contains(full.Error(), "store_full") {
		t.Fatalf("alpha stored %d keys, then: %v; want 4 (its bound), then refused store_full", stored, full)
	}
	if _, ok, err := alpha.Swap(ctx, "keya", value, rev0); err != nil || !ok {
		t.Errorf("alpha's renewal of a key it holds, at its bound: %v %v", ok, err)
	}
	if _, ok, err := alpha.Swap(ctx, "big", []byte(strings.Repeat("b", 4096)), 0); ok || !errors.Is(err, events.ErrWriteRefused) {
		t.Errorf("alpha's value over the bound of a key: swapped %v, %v; want refused", ok, err)
	}
	// Beta's OAuth token: created, then renewed a few times.
	rev, ok, err := beta.Swap(ctx, "oauth", value, 0)
	if err != nil || !ok {
		t.Fatalf("beta's token: %v %v", ok, err)
	}
	for i := 0; i < 3; i++ {
		if rev, ok, err = beta.Swap(ctx, "oauth", value, rev); err != nil || !ok {
			t.Fatalf("beta's renewal %d while alpha is at its bound: %v %v", i, ok, err)
		}
	}
}
