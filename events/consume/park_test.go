package consume_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// parkAfter is how long the tests' queues stay idle before they park.
const parkAfter = 300 * time.Millisecond

// An idle queue with a doorbell stops pulling: the server holds no pull for it, so it
// sends it no heartbeat and gets no renewal. A message published for it then rings the
// doorbell and is handled at once, although the queue checks the server only once an
// hour; and the queue parks again once idle.
func TestIdleQueuesParkUntilRung(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, 2*time.Minute)
	cons := consumer(t, bus, "p", 30*time.Second)
	pulls := eventstest.Counter(t, bus.Conn(), "$JS.API.CONSUMER.MSG.NEXT.*.p")
	var handled atomic.Int64
	obs := &parks{}
	serveParked(t, cons, consume.Config{Doorbell: consume.NewSubjectDoorbell(bus.Conn()), ParkCheck: time.Hour, Observer: obs},
		func(context.Context, jetstream.Msg) error { handled.Add(1); return nil })
	for round := 1; round <= 3; round++ {
		parkedBefore := obs.parked.Load()
		if _, err := bus.JetStream().Publish(ctx, "toolbus.p.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
		eventstest.Eventually(t, 30*time.Second, func() error {
			if n := handled.Load(); n != int64(round) {
				return fmt.Errorf("%d handled, want %d", n, round)
			}
			return nil
		})
		obs.waitParked(t, cons, parkedBefore)
		// Parked for good: no pull held and none sent for many times parkAfter.
		before, parked, pulled := pulls(), obs.parked.Load(), obs.unparked.Load()
		deadline := time.Now().Add(10 * parkAfter)
		for time.Now().Before(deadline) {
			if ci, err := cons.Info(ctx); err != nil || ci.NumWaiting != 0 {
				t.Fatalf("round %d: a parked queue holds %d pulls (%v)", round, ci.NumWaiting, err)
			}
			time.Sleep(parkAfter / 3)
		}
		if n := pulls() - before; n != 0 {
			t.Fatalf("round %d: %d pulls sent by a parked queue", round, n)
		}
		if p, u := obs.parked.Load(), obs.unparked.Load(); p != parked || u != pulled {
			t.Fatalf("round %d: parked and pulled again %d and %d times while idle", round, p-parked, u-pulled)
		}
	}
}

// A parked queue whose doorbell never rings still asks the server every ParkCheck and
// serves what waits; one whose rings may have been missed (the connection reconnected)
// pulls again at once.
func TestParkedQueuesLookForWorkWithoutTheirRing(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, 2*time.Minute)
	t.Run("check", func(t *testing.T) {
		cons := consumer(t, bus, "deaf", 30*time.Second)
		var handled atomic.Int64
		obs := &parks{}
		serveParked(t, cons, consume.Config{Doorbell: &deafDoorbell{}, ParkCheck: 2 * time.Second, Observer: obs},
			func(context.Context, jetstream.Msg) error { handled.Add(1); return nil })
		obs.waitParked(t, cons, 0)
		time.Sleep(consume.ParkRecheck + 500*time.Millisecond) // past the check that follows a park
		if _, err := bus.JetStream().Publish(ctx, "toolbus.deaf.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
		eventstest.Eventually(t, 30*time.Second, func() error {
			if n := handled.Load(); n != 1 {
				return fmt.Errorf("%d handled, want 1", n)
			}
			return nil
		})
	})
	t.Run("missed", func(t *testing.T) {
		cons := consumer(t, bus, "missed", 30*time.Second)
		bell := &deafDoorbell{}
		obs := &parks{}
		serveParked(t, cons, consume.Config{Doorbell: bell, ParkCheck: time.Hour, Observer: obs},
			func(context.Context, jetstream.Msg) error { return nil })
		obs.waitParked(t, cons, 0)
		bell.missed.Add(1)
		eventstest.Eventually(t, 30*time.Second, func() error {
			if obs.unparked.Load() == 0 {
				return errors.New("not pulling again after missed rings")
			}
			return nil
		})
	})
}

// Redeliveries publish nothing, so no doorbell rings for them: a queue with a message
// unacknowledged (here kept by its handler, as by a worker that died with it) does not
// park, and gets the message again when the server redelivers it after the ack wait.
func TestQueuesWithUnacknowledgedWorkKeepPulling(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, 2*time.Minute)
	cons := consumer(t, bus, "u", 3*time.Second)
	var (
		delivered atomic.Int64
		// parks counted at each delivery: the queue may park before the message is
		// published (a slow machine), never between its first delivery and the next.
		parksAt [3]atomic.Int64
	)
	obs := &parks{}
	serveParked(t, cons, consume.Config{Doorbell: consume.NewSubjectDoorbell(bus.Conn()), ParkCheck: time.Hour, Observer: obs},
		func(context.Context, jetstream.Msg) error {
			n := delivered.Add(1)
			if n <= 2 {
				parksAt[n].Store(obs.parked.Load())
			}
			if n == 1 {
				return consume.ErrHeld // never answered: redelivered after the ack wait
			}
			return nil
		})
	if _, err := bus.JetStream().Publish(ctx, "toolbus.u.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if delivered.Load() != 2 || ci.NumAckPending != 0 {
			return fmt.Errorf("%d deliveries (want 2), %d unacknowledged", delivered.Load(), ci.NumAckPending)
		}
		return nil
	})
	if n := parksAt[2].Load() - parksAt[1].Load(); n != 0 {
		t.Fatalf("parked %d times with a message unacknowledged", n)
	}
}

// Credentials that may not subscribe to the queue's filter get ErrDoorbellRefused, and
// the queue keeps pulling: it never parks and serves every message.
func TestRefusedDoorbellKeepsPulling(t *testing.T) {
	all := &server.SubjectPermission{Allow: []string{">"}}
	srv := eventstest.StartServer(t, &server.Options{JetStream: true, Users: []*server.User{
		{Username: "admin", Password: "a"},
		{Username: "worker", Password: "w", Permissions: &server.Permissions{Publish: all,
			Subscribe: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"toolbus.>"}}}},
	}})
	admin, err := nats.Connect(srv.ClientURL(), nats.UserInfo("admin", "a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	ctx := eventstest.Context(t, 2*time.Minute)
	bus, _, err := provision.Setup(ctx, admin, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cons := consumer(t, bus, "r", 30*time.Second)
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("worker", "w"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	wcons, err := js.Consumer(ctx, bus.Config().Stream, "r")
	if err != nil {
		t.Fatal(err)
	}
	bell := consume.NewSubjectDoorbell(nc)
	if _, err := bell.Listen(ctx, wcons, func() {}); !errors.Is(err, consume.ErrDoorbellRefused) {
		t.Fatalf("Listen without permission: %v, want ErrDoorbellRefused", err)
	}
	var handled atomic.Int64
	obs := &parks{}
	serveParked(t, wcons, consume.Config{Doorbell: bell, ParkCheck: time.Hour, Observer: obs},
		func(context.Context, jetstream.Msg) error { handled.Add(1); return nil })
	eventstest.Eventually(t, 30*time.Second, func() error {
		ci, err := cons.Info(ctx)
		if err != nil || ci.NumWaiting == 0 {
			return fmt.Errorf("no pull yet (%v)", err)
		}
		return nil
	})
	time.Sleep(10 * parkAfter) // the watch would have parked it many times over
	ci, err := cons.Info(ctx)
	if err != nil || ci.NumWaiting == 0 || obs.parked.Load() != 0 {
		t.Fatalf("a queue whose doorbell was refused parked %d times and holds %d pulls (%v)", obs.parked.Load(), ci.NumWaiting, err)
	}
	if _, err := bus.JetStream().Publish(ctx, "toolbus.r.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		if n := handled.Load(); n != 1 {
			return fmt.Errorf("%d handled, want 1", n)
		}
		return nil
	})
}

// parks counts the parks and unparks of a loop's queues.
type parks struct {
	parked, unparked atomic.Int64
}

func (*parks) Serving([]string)   {}
func (*parks) Stopped([]string)   {}
func (*parks) Redelivered(string) {}
func (*parks) Terminated(string)  {}
func (p *parks) Parked(_ string, parked bool) {
	if parked {
		p.parked.Add(1)
	} else {
		p.unparked.Add(1)
	}
}

// waitParked waits until the queue parked more than before times and is parked (it
// pulled again one time fewer), then checks that the server holds no pull for it.
func (p *parks) waitParked(t *testing.T, cons jetstream.Consumer, before int64) {
	t.Helper()
	eventstest.Eventually(t, 30*time.Second, func() error {
		if n := p.parked.Load(); n <= before || p.unparked.Load() != n-1 {
			return fmt.Errorf("parked %d times (%d before), pulled again %d times", n, before, p.unparked.Load())
		}
		ci, err := cons.Info(context.Background())
		if err != nil || ci.NumWaiting != 0 {
			return fmt.Errorf("the server holds a pull for a parked queue (%v)", err)
		}
		return nil
	})
}

var _ consume.ParkObserver = (*parks)(nil)

// deafDoorbell listens without ever ringing; Missed is what the test sets.
type deafDoorbell struct{ missed atomic.Uint64 }

func (*deafDoorbell) Listen(context.Context, jetstream.Consumer, func()) (func(), error) {
	return func() {}, nil
}
func (d *deafDoorbell) Missed() uint64 { return d.missed.Load() }

// consumer creates the durable name on the toolbus.<name>.> messages.
func consumer(t *testing.T, bus *events.Bus, name string, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	cons, err := provision.Consumer(eventstest.Context(t, time.Minute), bus, provision.ConsumerConfig{Durable: name,
		Filters: []string{"toolbus." + name + ".>"}, AckWait: ackWait, MaxDeliver: 5, MaxAckPending: 10})
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// serveParked serves cons with cfg (parking after parkAfter) until the test ends.
func serveParked(t *testing.T, cons jetstream.Consumer, cfg consume.Config, h consume.Handler) {
	t.Helper()
	cfg.Concurrency, cfg.Grace, cfg.ParkAfter = 4, time.Second, parkAfter
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = consume.Serve(ctx, cons, cfg, h) }()
	t.Cleanup(func() { stop(); wg.Wait() })
}

// failingConsumer is a consumer whose Consume fails while fail is set, counting calls.
type failingConsumer struct {
	jetstream.Consumer
	fail  atomic.Bool
	calls atomic.Int64
}

func (c *failingConsumer) Consume(h jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	c.calls.Add(1)
	if c.fail.Load() {
		return nil, errors.New("consume refused by the test")
	}
	return c.Consumer.Consume(h, opts...)
}

// A parked queue that cannot pull again when rung tries again after a growing delay,
// not at every tick, and serves the call once it can.
func TestParkedQueueRetriesPullingAgain(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, 2*time.Minute)
	cons := &failingConsumer{Consumer: consumer(t, bus, "retry", 30*time.Second)}
	var handled atomic.Int64
	obs := &parks{}
	serveParked(t, cons, consume.Config{Doorbell: consume.NewSubjectDoorbell(bus.Conn()), ParkCheck: time.Hour, Observer: obs},
		func(context.Context, jetstream.Msg) error { handled.Add(1); return nil })
	obs.waitParked(t, cons, 0)
	cons.fail.Store(true)
	before := cons.calls.Load()
	if _, err := bus.JetStream().Publish(ctx, "toolbus.retry.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // 16 ticks of the watch
	// Tries after 0, 0.5, 1.5 and 3.5 s: a few, not one per tick.
	if n := cons.calls.Load() - before; n < 2 || n > 5 {
		t.Fatalf("%d tries to pull again in 4 s, want a few (backing off)", n)
	}
	if handled.Load() != 0 {
		t.Fatal("handled while pulling failed")
	}
	cons.fail.Store(false)
	eventstest.Eventually(t, 30*time.Second, func() error {
		if n := handled.Load(); n != 1 {
			return fmt.Errorf("%d handled, want 1", n)
		}
		return nil
	})
}
