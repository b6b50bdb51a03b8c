package consume_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// A handler that panics does not block its queue: Serve recovers, terminates the
// message with the panic as reason (it is not redelivered), and handles the next ones.
func TestServeRecoversHandlerPanics(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, time.Minute)
	var (
		mu      sync.Mutex
		handled = map[string]int{}
	)
	cons := serve(t, bus, "p", 1, func(_ context.Context, msg jetstream.Msg) error {
		mu.Lock()
		handled[msg.Subject()]++
		mu.Unlock()
		if msg.Subject() == "toolbus.p.boom" {
			panic("boom")
		}
		return nil
	})

	// MaxAckPending 1: a panicking message left unacknowledged would hold the queue.
	for _, subj := range []string{"toolbus.p.boom", "toolbus.p.after1", "toolbus.p.after2"} {
		if _, err := bus.JetStream().Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if handled["toolbus.p.after2"] == 0 || ci.NumPending != 0 || ci.NumAckPending != 0 {
			return fmt.Errorf("handled %v, %d pending, %d unacknowledged", handled, ci.NumPending, ci.NumAckPending)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if handled["toolbus.p.boom"] != 1 {
		t.Fatalf("the panicking message was handled %d times, want 1 (terminated, not redelivered)", handled["toolbus.p.boom"])
	}
}

// A handler that returns ErrHeld keeps its message: Serve neither acknowledges nor hands
// it back, its Concurrency slot is free for the next message at once, and the message
// is done when the handler acknowledges it later.
func TestServeLeavesHeldMessagesToTheirHandler(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, time.Minute)
	var (
		mu      sync.Mutex
		kept    jetstream.Msg
		handled = map[string]int{}
	)
	cons := serve(t, bus, "h", 10, func(_ context.Context, msg jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		handled[msg.Subject()]++
		if msg.Subject() == "toolbus.h.kept" {
			kept = msg
			return consume.ErrHeld
		}
		return nil
	})
	for _, subj := range []string{"toolbus.h.kept", "toolbus.h.next"} {
		if _, err := bus.JetStream().Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	state := func(wantPending int) func() error {
		return func() error {
			ci, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if handled["toolbus.h.next"] != 1 || ci.NumPending != 0 || ci.NumAckPending != wantPending || ci.NumRedelivered != 0 {
				return fmt.Errorf("handled %v, %d pending, %d unacknowledged (want %d), %d redelivered",
					handled, ci.NumPending, ci.NumAckPending, wantPending, ci.NumRedelivered)
			}
			return nil
		}
	}
	// With one slot, the next message is handled while the first is kept, unacknowledged.
	eventstest.Eventually(t, 30*time.Second, state(1))
	mu.Lock()
	msg := kept
	mu.Unlock()
	if err := msg.Ack(); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, state(0))
	mu.Lock()
	defer mu.Unlock()
	if handled["toolbus.h.kept"] != 1 {
		t.Fatalf("the kept message was handled %d times, want 1", handled["toolbus.h.kept"])
	}
}

// serve runs consume.Serve with one slot on a new consumer of the toolbus.<name>.>
// messages until the test ends, handling them with h.
func serve(t *testing.T, bus *events.Bus, name string, maxAckPending int, h consume.Handler) jetstream.Consumer {
	t.Helper()
	ctx := eventstest.Context(t, time.Minute)
	cons, err := provision.Consumer(ctx, bus, provision.ConsumerConfig{Durable: name, Filters: []string{"toolbus." + name + ".>"},
		AckWait: 30 * time.Second, MaxDeliver: 5, MaxAckPending: maxAckPending})
	if err != nil {
		t.Fatal(err)
	}
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consume.Serve(serveCtx, cons, consume.Config{Concurrency: 1, Grace: time.Second}, h) }()
	t.Cleanup(func() { stop(); <-done })
	return cons
}
