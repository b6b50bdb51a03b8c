package consume_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// A loop that stops hands back what the server sent it and no handler took: the next
// worker gets those messages at once, not one AckWait later. Here the pool of the first
// loop is full of handlers that wait for their context, so the server's later batch
// stays in the client's buffer; the consumer's AckWait is 10 minutes, so a message the
// stop dropped would not come back within the minute the second loop is given. (A stop
// that dropped the buffer left each message unacknowledged until its AckWait: with the
// planner's and the injector's default of 30 s, two restarts of a worker in one run
// could add a minute to it.)
func TestStopHandsBackWhatItWasSent(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, 2*time.Minute)
	cons, err := provision.Consumer(ctx, bus, provision.ConsumerConfig{Durable: "s", Filters: []string{"toolbus.s.>"},
		AckWait: 10 * time.Minute, MaxDeliver: 5, MaxAckPending: 1000})
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		if _, err := bus.JetStream().Publish(ctx, "toolbus.s."+strconv.Itoa(i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		waiting int
		done    = map[string]bool{}
	)
	first, stop := context.WithCancel(ctx)
	ended := make(chan error, 1)
	go func() {
		ended <- consume.Serve(first, cons, consume.Config{Concurrency: 4, Grace: 100 * time.Millisecond}, func(hctx context.Context, _ jetstream.Msg) error {
			mu.Lock()
			waiting++
			mu.Unlock()
			<-hctx.Done()
			return hctx.Err()
		})
	}()
	eventstest.Eventually(t, 30*time.Second, func() error {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		// Four in the handlers, and more sent to the client than the pool took.
		if waiting < 4 || ci.NumAckPending <= 5 {
			return fmt.Errorf("%d handlers waiting, %d messages sent to the loop", waiting, ci.NumAckPending)
		}
		return nil
	})
	stop()
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	second, stopSecond := context.WithCancel(ctx)
	defer stopSecond()
	go func() {
		_ = consume.Serve(second, cons, consume.Config{Concurrency: 4, Grace: time.Second}, func(_ context.Context, msg jetstream.Msg) error {
			mu.Lock()
			done[msg.Subject()] = true
			mu.Unlock()
			return nil
		})
	}()
	eventstest.Eventually(t, time.Minute, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(done) != n {
			return fmt.Errorf("the second loop handled %d of %d messages", len(done), n)
		}
		return nil
	})
}
