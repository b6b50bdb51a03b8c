package intake_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// A team at its bound of a shared bucket's keys floods writes of new keys. The write
// service admits every tenant's writes one at a time, in the order received, so what
// it does for one write every other tenant's writes wait behind: a refusal at the bound
// must cost it no request of the core's JetStream (each was a stream info, asked on the
// server's one info queue, in line). Alpha's 2,000 new keys past its bound are refused
// with at most a few reads of its keys, and beta's token, written after them, is stored
// (the control: alpha's keys under its bound are stored, the next refused store_full).
func TestTenantFloodAtItsBoundCostsTheCoreNoRead(t *testing.T) {
	srv := eventstest.StartTenantsBare(t, map[string][]string{"alpha": nil, "beta": nil}, nil)
	ctx := eventstest.Context(t, time.Minute)
	core := eventstest.Connect(t, srv, "core")
	intaketest.ServeIntake(t, core, intake.Limits{Buckets: map[string]intake.BucketBound{store.BucketSecrets: {Keys: 4}}})
	if _, _, err := provision.Setup(ctx, core, events.Config{}); err != nil {
		t.Fatal(err)
	}
	alpha, beta := eventstest.Connect(t, srv, "alpha"), eventstest.Connect(t, srv, "beta")
	put := func(team, key string) string {
		t.Helper()
		nc := map[string]*nats.Conn{"alpha": alpha, "beta": beta}[team]
		m, err := nc.Request("$KV."+store.BucketSecrets+"."+team+"."+key, []byte("v"), 30*time.Second)
		if err != nil {
			t.Fatalf("%s's key %s: %v", team, key, err)
		}
		return string(m.Data)
	}
	for i := range 4 {
		if a := put("alpha", fmt.Sprint("k", i)); !strings.Contains(a, `"seq"`) {
			t.Fatalf("control: alpha's key %d under its bound: %s", i, a)
		}
	}
	if a := put("alpha", "k4"); !strings.Contains(a, "store_full") {
		t.Fatalf("control: alpha's key past its bound: %s", a)
	}
	api := func() uint64 {
		t.Helper()
		js, err := srv.Jsz(nil)
		if err != nil {
			t.Fatal(err)
		}
		return js.API.Total
	}
	before := api()
	const flood = 2000
	for i := range flood {
		if err := alpha.Publish(fmt.Sprintf("$KV.%s.alpha.new%d", store.BucketSecrets, i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := alpha.Flush(); err != nil {
		t.Fatal(err)
	}
	waited := time.Now()
	if a := put("beta", "oauth"); !strings.Contains(a, `"seq"`) {
		t.Fatalf("control: beta's token after alpha's flood: %s", a)
	}
	t.Logf("beta's token waited %v behind alpha's flood", time.Since(waited))
	if used := api() - before; used > 20 {
		t.Errorf("HOLE: alpha's %d writes past its bound cost the core %d JetStream API requests, made one at a time where every tenant's writes wait", flood, used)
	}
}
