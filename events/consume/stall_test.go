package consume_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// restarts counts the PullRestarted calls of a loop.
type restarts struct {
	n atomic.Int64
}

func (*restarts) Serving([]string)       {}
func (*restarts) Stopped([]string)       {}
func (*restarts) Redelivered(string)     {}
func (*restarts) Terminated(string)      {}
func (r *restarts) PullRestarted(string) { r.n.Add(1) }
func (r *restarts) count() int64         { return r.n.Load() }

var _ consume.PullObserver = (*restarts)(nil)

// A loop whose pull the server no longer holds, while calls wait on its queue, pulls
// again within a second or so instead of waiting for its missed heartbeats: here the
// consumer is deleted and re-created under the busy loop (the server answers the loop's
// waiting pull with 409 Consumer Deleted, which ends nats.go's consume loop for good,
// and the new consumer holds no pull). The loop cannot see that from its deliveries: it
// sees only that it was busy and went silent with free slots. Without the stall watch
// the calls published after the re-creation are never delivered.
func TestServePullsAgainWhenTheServerLostItsPull(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, 2*time.Minute)
	cc := provision.ConsumerConfig{Durable: "lost", Filters: []string{"toolbus.l.>"},
		AckWait: 30 * time.Second, MaxDeliver: 5, MaxAckPending: 100, DeliverNew: true}
	cons, err := provision.Consumer(ctx, bus, cc)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		handled = map[string]int{}
		blocked atomic.Int64
		release = make(chan struct{})
		obs     = &restarts{}
	)
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		// As many slots as the burst that arms the watch: the first burst fills the
		// pool, so the loop is not checked before the consumer is re-created.
		done <- consume.Serve(serveCtx, cons, consume.Config{Concurrency: consume.StallBurst, Grace: time.Second, Observer: obs},
			func(_ context.Context, msg jetstream.Msg) error {
				if strings.HasPrefix(msg.Subject(), "toolbus.l.first.") {
					blocked.Add(1)
					<-release
				}
				mu.Lock()
				handled[msg.Subject()]++
				mu.Unlock()
				return nil
			})
	}()
	defer func() { stop(); <-done }()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	for i := range consume.StallBurst {
		if _, err := bus.JetStream().Publish(ctx, fmt.Sprintf("toolbus.l.first.%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	// Every slot busy, and the loop's next pull waiting on the server.
	eventstest.Eventually(t, 30*time.Second, func() error {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if blocked.Load() != consume.StallBurst || ci.NumWaiting == 0 {
			return fmt.Errorf("%d handlers blocked, %d pulls waiting", blocked.Load(), ci.NumWaiting)
		}
		return nil
	})
	if err := bus.EventStream().DeleteConsumer(ctx, "lost"); err != nil {
		t.Fatal(err)
	}
	if _, err := provision.Consumer(ctx, bus, cc); err != nil {
		t.Fatal(err)
	}
	const after = 4
	for i := range after {
		if _, err := bus.JetStream().Publish(ctx, fmt.Sprintf("toolbus.l.after.%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	released = true
	// Far below the heartbeats' 10 s, and without the watch never.
	eventstest.Eventually(t, 8*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for i := range after {
			n += handled[fmt.Sprintf("toolbus.l.after.%d", i)]
		}
		if n != after {
			return fmt.Errorf("%d of the %d calls published after the re-creation handled (restarts %d)", n, after, obs.count())
		}
		return nil
	})
	if obs.count() == 0 {
		t.Fatal("the loop pulled again without telling its PullObserver")
	}
}

// The watch costs nothing while a loop is idle or sparse: no consumer-info request after
// fewer than StallBurst messages, one after a burst that ends, none after it until more
// messages come.
func TestServeChecksItsPullOncePerSilence(t *testing.T) {
	tb := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	bus, _, err := provision.Setup(ctx, tb.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := provision.Consumer(ctx, bus, provision.ConsumerConfig{Durable: "quiet", Filters: []string{"toolbus.q.>"},
		AckWait: 30 * time.Second, MaxDeliver: 5, MaxAckPending: 100})
	if err != nil {
		t.Fatal(err)
	}
	watcher, _ := tb.Connect(t)
	var infos atomic.Int64
	sub, err := watcher.Subscribe("$JS.API.CONSUMER.INFO."+cons.CachedInfo().Stream+".quiet", func(*nats.Msg) { infos.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- consume.Serve(serveCtx, cons, consume.Config{Concurrency: 16, Grace: time.Second},
			func(context.Context, jetstream.Msg) error { handled.Add(1); return nil })
	}()
	defer func() { stop(); <-done }()
	publish := func(n int) {
		t.Helper()
		want := handled.Load() + int64(n)
		for range n {
			if _, err := bus.JetStream().Publish(ctx, "toolbus.q.x", []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		eventstest.Eventually(t, 30*time.Second, func() error {
			if got := handled.Load(); got != want {
				return fmt.Errorf("%d handled, want %d", got, want)
			}
			return nil
		})
	}
	// Silences well past StallSilence: the watch looks at least this often.
	quiet := func() { time.Sleep(4 * consume.StallSilence) }

	publish(consume.StallBurst - 1)
	quiet()
	if n := infos.Load(); n != 0 {
		t.Fatalf("%d consumer-info requests after fewer than %d messages, want 0", n, consume.StallBurst)
	}
	publish(consume.StallBurst)
	eventstest.Eventually(t, 30*time.Second, func() error {
		if infos.Load() == 0 {
			return fmt.Errorf("no consumer-info request after a burst of %d messages and a silence", consume.StallBurst)
		}
		return nil
	})
	quiet()
	if n := infos.Load(); n != 1 {
		t.Fatalf("%d consumer-info requests for one silence of an idle loop, want 1", n)
	}
	publish(1) // the loop still has its pull
}
