package reads_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/reads"
)

// TestTeamReadsOnlyItsKeys: the read service answers a team's executor the keys its
// direct gets reach (events.TeamReadPrefix, what it reads where the buckets serve no
// direct gets: a replicated deployment), the same message the direct get finds. Team
// alpha asking for team beta's tool's entry, or for its own secrets, reaches nothing
// (the core exports neither to it), and the service refuses any other subject even from
// inside the core: another team's instance record, the secrets, a wildcard, a claim key
// of no shape toolbus writes. CONTROL:
// beta reads its own entry the same way, and alpha's own keys are found. Once the
// catalog bucket serves no direct gets (as a replicated one), alpha's executor bus
// still reads its entry: through the service.
func TestTeamReadsOnlyItsKeys(t *testing.T) {
	srv := intaketest.StartTenants(t, map[string][]string{"alpha": {"calc"}, "beta": {"web"}}, nil)
	core := eventstest.Connect(t, srv, "core")
	ctx := eventstest.Context(t, 2*time.Minute)
	bus, _, err := provision.Setup(ctx, core, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- reads.New(bus, nil).Serve(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("read service: %v", err)
		}
	})
	js := bus.JetStream()
	put := func(bucket, key, val string) {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, key, []byte(val)); err != nil {
			t.Fatal(err)
		}
	}
	put(store.BucketTools, "calc", `{"name":"calc"}`)
	put(store.BucketTools, "web", `{"name":"web"}`)
	put(store.BucketInstances, "alpha.a1", `{"name":"a1"}`)
	put(store.BucketInstances, "beta.b1", `{"name":"b1"}`)
	put(store.BucketSecrets, "alpha.token", `secret`)
	put(store.BucketClaims, "calc.r1.0.c1", `{"instance":"a1"}`)
	put(store.BucketClaims, "calc.r1.x", `{"instance":"odd"}`)
	alpha, beta := eventstest.Connect(t, srv, "alpha"), eventstest.Connect(t, srv, "beta")
	kvRead := func(bucket, key string) string { return events.TeamReadLocal("KV_"+bucket, "$KV."+bucket+"."+key) }
	get := func(nc *nats.Conn, subject string) (*nats.Msg, error) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return nc.RequestWithContext(rctx, subject, nil)
	}
	found := func(nc *nats.Conn, subject, want string) {
		t.Helper()
		eventstest.Eventually(t, 30*time.Second, func() error { // the service subscribes as it starts
			m, err := get(nc, subject)
			if err != nil {
				return err
			}
			if string(m.Data) != want || m.Header.Get("Nats-Sequence") == "" {
				return errors.New(m.Header.Get("Status") + " " + m.Header.Get("Description") + " " + string(m.Data))
			}
			return nil
		})
	}
	// CONTROL: each team's own keys, as the direct get finds them (one replica here).
	found(alpha, kvRead(store.BucketTools, "calc"), `{"name":"calc"}`)
	found(alpha, accountsDirect(store.BucketTools, "calc"), `{"name":"calc"}`)
	found(alpha, kvRead(store.BucketInstances, "alpha.a1"), `{"name":"a1"}`)
	found(beta, kvRead(store.BucketTools, "web"), `{"name":"web"}`)
	found(alpha, kvRead(store.BucketClaims, "calc.r1.0.c1"), `{"instance":"a1"}`)
	found(alpha, accountsDirect(store.BucketSecrets, "alpha.token"), `secret`)
	for _, s := range []string{kvRead(store.BucketTools, "web"), kvRead(store.BucketInstances, "beta.b1"), kvRead(store.BucketSecrets, "alpha.token")} {
		if m, err := get(alpha, s); !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("alpha asking %s: want no responders (not exported to it), got %v %v", s, err, m)
		}
	}
	// From inside the core, past the exports: the service's own checks.
	for _, s := range []string{
		events.TeamReadSubject("alpha", "KV_"+store.BucketInstances, "$KV."+store.BucketInstances+".beta.b1"),
		events.TeamReadSubject("alpha", "KV_"+store.BucketSecrets, "$KV."+store.BucketSecrets+".alpha.token"),
		events.TeamReadSubject("alpha", "KV_"+store.BucketTools, "$KV."+store.BucketTools+".*"),
		events.TeamReadSubject("alpha", "KV_"+store.BucketRuns, "$KV."+store.BucketRuns+".r1"),
		// A key of no shape toolbus writes, even of alpha's tool.
		events.TeamReadSubject("alpha", "KV_"+store.BucketClaims, "$KV."+store.BucketClaims+".calc.r1.x"),
	} {
		m, err := get(core, s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if m.Header.Get("Status") != "400" || len(m.Data) > 0 {
			t.Errorf("%s: want a 400 refusal, got %q %q", s, m.Header.Get("Status"), m.Data)
		}
	}
	if m, err := get(core, events.TeamReadSubject("alpha", "KV_"+store.BucketInstances, "$KV."+store.BucketInstances+".alpha.a1")); err != nil || string(m.Data) != `{"name":"a1"}` {
		t.Errorf("CONTROL: the core asking alpha's own instance: %v %v", err, m)
	}
	// The catalog bucket stops serving direct gets, as a replicated one does: nothing
	// answers alpha's direct get any more, and alpha's executor bus still reads its
	// entry (through the read service).
	st, err := js.Stream(ctx, "KV_"+store.BucketTools)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		if _, err := get(alpha, accountsDirect(store.BucketTools, "calc")); !errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("the direct get is still answered: %v", err)
		}
		return nil
	})
	team, err := events.Open(ctx, alpha, events.Config{APIPrefix: "JS.core.API"})
	if err != nil {
		t.Fatal(err)
	}
	tc, err := team.Store().Contract(ctx, "calc")
	if err != nil || tc.Name != "calc" {
		t.Errorf("alpha's executor reading its entry with no direct gets served: %+v %v", tc, err)
	}
}

// accountsDirect is the direct get of key in bucket as a team account imports it.
func accountsDirect(bucket, key string) string {
	return "JS.core.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "." + key
}
