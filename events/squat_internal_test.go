package events

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events/store"
)

// Two workers publishing the same squatted event at once (a redelivery racing the
// first handler) store it once: both look the subject up before either publishes, and
// the per-subject guard lets only one of them through; the other finds the event.
func TestSquattedEventRaceStoredOnce(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bus := openMinimal(ctx, t, nc)
	const racers = 2
	var (
		arrived sync.WaitGroup
		first   atomic.Int32
	)
	arrived.Add(racers)
	guardHook = func() {
		// The first look-up of each racer waits for the other's: both saw the same
		// last sequence of the subject.
		if first.Add(1) <= racers {
			arrived.Done()
			arrived.Wait()
		}
	}
	t.Cleanup(func() { guardHook = nil })
	e := ToolFinishedEvent("/toolbus/executor/1", toolbus.ToolFinished{RunID: "race", Step: 0, CallIndex: 0, CallCount: 1,
		ToolResult: toolbus.ToolResult{CallID: "c", Tool: "noop", Status: toolbus.StatusSucceeded, Content: "{}"}})
	squatMsg, err := Encode(SubjectRunStarted("decoy", ""), e.Meta, e.Data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.js.PublishMsg(ctx, squatMsg, jetstream.WithMsgID(e.Meta.ID)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, racers)
	for range racers {
		wg.Go(func() {
			_, err := bus.PublishEvent(ctx, e)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for seq := uint64(1); ; n++ {
		raw, err := bus.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(e.Subject))
		if err != nil {
			break
		}
		seq = raw.Sequence + 1
	}
	if n != 1 {
		t.Fatalf("the raced event is stored %d times, want once", n)
	}
}

// openMinimal creates the event stream and the buckets as package provision does (which
// this internal test cannot import: provision imports events) and opens the bus.
func openMinimal(ctx context.Context, t *testing.T, nc *nats.Conn) *Bus {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: DefaultStream, Subjects: []string{FilterAll},
		Duplicates: DefaultDuplicates, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{store.BucketHistory, store.BucketRuns, store.BucketTools, store.BucketApprovals,
		store.BucketClaims, store.BucketInstances, store.BucketOutputs} {
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name}); err != nil {
			t.Fatal(err)
		}
	}
	bus, err := Open(ctx, nc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	return bus
}
