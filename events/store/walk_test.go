package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// A catalog view reads the tools bucket whole only when the bucket's stream changed
// since its last whole read: while nothing changes, the periodic whole read is one
// request for the stream's state. A message an administrator removes from the stream
// (a purge of its subject: no message tells of it) changes that state, and the next whole read drops the tool.
func TestCatalogReadsWholeOnlyWhatChanged(t *testing.T) {
	defer store.SetCatalogFullEvery(2)()
	poll := store.CatalogPoll
	store.CatalogPoll = 20 * time.Millisecond
	defer func() { store.CatalogPoll = poll }()
	ctx := eventstest.Context(t, 2*time.Minute)
	tb := eventstest.RunJetStream(t)
	bus, _, err := provision.Setup(ctx, tb.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := tb.JS.KeyValue(ctx, store.BucketTools)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		name := fmt.Sprintf("t%04d", i)
		if _, err := kv.Put(ctx, name, []byte(fmt.Sprintf(`{"name":%q}`, name))); err != nil {
			t.Fatal(err)
		}
	}
	wholeReads := countWholeReads(t, tb, store.BucketTools)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	cat, err := bus.Store().WatchCatalog(wctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 40 polls or more with nothing changing: 20 whole reads before this test's change,
	// only the first one now.
	time.Sleep(40 * store.CatalogPoll * 2)
	if n := wholeReads.Load(); n != 1 {
		t.Fatalf("%d whole reads of an unchanged tools bucket, want 1 (the first)", n)
	}
	if _, ok := cat.Lookup("t0007"); !ok {
		t.Fatal("t0007 not in the catalog")
	}
	str, err := tb.JS.Stream(ctx, "KV_"+store.BucketTools)
	if err != nil {
		t.Fatal(err)
	}
	// A bucket's stream refuses message deletes; a purge of one subject is allowed.
	if err := str.Purge(ctx, jetstream.WithPurgeSubject("$KV."+store.BucketTools+".t0007")); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		if _, ok := cat.Lookup("t0007"); ok {
			return fmt.Errorf("t0007, deleted from the stream, still in the catalog (%d whole reads)", wholeReads.Load())
		}
		return nil
	})
	if _, ok := cat.Lookup("t0008"); !ok {
		t.Fatal("t0008 lost")
	}
}

// The instances are read whole once, then only from the last message read on: a
// heartbeat, a new instance, one deleted at stop and one expired (the marker its
// bucket leaves) all reach the view, with no further whole read. Whole reads at every
// poll were most of an idle catalog view's cost at 1,000 tools.
func TestCatalogReadsInstancesFromTheLastMessage(t *testing.T) {
	defer store.SetCatalogFullEvery(1 << 30)()
	poll := store.CatalogPoll
	store.CatalogPoll = 20 * time.Millisecond
	defer func() { store.CatalogPoll = poll }()
	ctx := eventstest.Context(t, 2*time.Minute)
	tb := eventstest.RunJetStream(t)
	bus, _, err := provision.Setup(ctx, tb.Conn, events.Config{InstanceTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st := bus.Store()
	put := func(name string) {
		t.Helper()
		now := time.Now()
		if _, err := st.PutInstance(ctx, store.Instance{Name: name, Boot: "b", Tools: []string{"echo"}, Concurrency: 1, StartedAt: now, HeartbeatAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	put("stays")
	put("stops")
	put("dies")
	wholeReads := countWholeReads(t, tb, store.BucketInstances)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	cat, err := st.WatchCatalog(wctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	serving := func() string { return strings.Join(cat.Serving("echo"), ",") }
	if got := serving(); got != "dies,stays,stops" {
		t.Fatalf("serving echo: %q", got)
	}
	// "stays" heartbeats; "stops" is deleted; "late" starts; "dies" stops heartbeating
	// and expires after the bucket's TTL.
	beat := time.NewTicker(300 * time.Millisecond)
	defer beat.Stop()
	if err := st.DeleteInstance(ctx, "", "stops", "b"); err != nil {
		t.Fatal(err)
	}
	put("late")
	eventstest.Eventually(t, 30*time.Second, func() error {
		select {
		case <-beat.C:
			put("stays")
			put("late")
		default:
		}
		if got := serving(); got != "late,stays" {
			return fmt.Errorf("serving echo: %q, want late,stays", got)
		}
		return nil
	})
	if n := wholeReads.Load(); n != 1 {
		t.Fatalf("%d whole reads of the instances, want 1 (the first)", n)
	}
}

// countWholeReads counts the whole reads of bucket from now on: batched direct gets
// from the bucket's first message.
func countWholeReads(t *testing.T, tb *eventstest.Bus, bucket string) *atomic.Int64 {
	t.Helper()
	watcher, _ := tb.Connect(t)
	var n atomic.Int64
	sub, err := watcher.Subscribe("$JS.API.DIRECT.GET.KV_"+bucket, func(m *nats.Msg) {
		if strings.Contains(string(m.Data), `"seq":1,`) {
			n.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n
}

// A writer of the catalog's bucket (any team, for its own tools' keys) that stores an
// entry with a Status header and no value hides no other tool from the readers: batched
// and key-by-key reads tell a stored message from a status by its sequence header.
func TestCatalogForgedStatusHidesNoTool(t *testing.T) {
	ctx := eventstest.Context(t, time.Minute)
	tb := eventstest.RunJetStream(t)
	bus, _, err := provision.Setup(ctx, tb.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	put := func(name string) {
		t.Helper()
		if _, err := tb.JS.Publish(ctx, "$KV."+store.BucketTools+"."+name, []byte(fmt.Sprintf(`{"name":%q,"description":"d"}`, name))); err != nil {
			t.Fatal(err)
		}
	}
	put("first")
	forged := &nats.Msg{Subject: "$KV." + store.BucketTools + ".mine", Header: nats.Header{"Status": {"404"}, "Description": {"Message Not Found"}}}
	if _, err := tb.JS.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	put("later")
	contracts, err := bus.Store().Contracts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range contracts {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); !strings.Contains(got, "first") || !strings.Contains(got, "later") {
		t.Fatalf("the catalog reads %q: a forged status hid a tool", got)
	}
}
