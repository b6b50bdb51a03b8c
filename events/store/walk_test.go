package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
)

// A catalog of more tools than one batched read answers is read whole (deleted tools
// left out) in a few requests, not one per tool: what a catalog view pays every poll.
func TestCatalogOfManyToolsReadInFewRequests(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	tb := eventstest.RunJetStream(t)
	bus, _, err := provision.Setup(ctx, tb.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2500 // more than two batches
	kv, err := tb.JS.KeyValue(ctx, store.BucketTools)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := fmt.Sprintf("t%04d", i)
		if _, err := kv.Put(ctx, name, []byte(fmt.Sprintf(`{"name":%q,"description":"d%d"}`, name, i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i += 100 {
		if err := kv.Delete(ctx, fmt.Sprintf("t%04d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Written again after the deletes: the last value stands.
	if _, err := kv.Put(ctx, "t0001", []byte(`{"name":"t0001","description":"again"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Store().PutInstance(ctx, store.Instance{Name: "all", Boot: "b", Tools: []string{"t0001", "t0002"}}); err != nil {
		t.Fatal(err)
	}
	before := serverIn(t, tb)
	cat, err := bus.Store().WatchCatalog(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if reqs := serverIn(t, tb) - before; reqs > 8 {
		t.Errorf("reading a catalog of %d tools took %d requests, want a few batched ones", n, reqs)
	}
	known := 0
	for i := range n {
		_, ok := cat.Lookup(fmt.Sprintf("t%04d", i))
		if ok {
			known++
		}
		if ok == (i%100 == 0) {
			t.Fatalf("tool t%04d known %v, deleted %v", i, ok, i%100 == 0)
		}
	}
	if known != n-n/100 {
		t.Fatalf("%d tools known, want %d", known, n-n/100)
	}
	if c, _ := cat.Lookup("t0001"); c.Description != "again" {
		t.Fatalf("t0001 = %+v, want the value written last", c)
	}
	if got := cat.Tools(nil); len(got) != 2 {
		t.Fatalf("offered %d tools, want the 2 the live instance serves", len(got))
	}
	// Later changes reach the view (read from the last message on): a new tool, a
	// changed one, a deleted one.
	if _, err := kv.Put(ctx, "fresh", []byte(`{"name":"fresh"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "t0002", []byte(`{"name":"t0002","description":"changed"}`)); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "t0003"); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, fresh := cat.Lookup("fresh")
		c2, _ := cat.Lookup("t0002")
		_, gone := cat.Lookup("t0003")
		if !fresh || c2.Description != "changed" || gone {
			return fmt.Errorf("fresh known %v, t0002 %q, t0003 known %v", fresh, c2.Description, gone)
		}
		return nil
	})
}

func serverIn(t *testing.T, tb *eventstest.Bus) int64 {
	t.Helper()
	if err := tb.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	v, err := tb.Server.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	return v.InMsgs
}
