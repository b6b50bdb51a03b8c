// Package consume is the consume loop of the workers: it serves durable pull consumers
// with bounded concurrency, acknowledges what a handler finished, hands back what must
// wait (DeferError), redelivers infrastructure failures with a growing delay and
// terminates poison messages (events.ErrPoison) with their reason.
package consume

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// Handler processes one message. Returning nil acknowledges it; an error wrapping
// events.ErrPoison or events.ErrNotCloudEvent terminates it with the error as reason; any other error
// is an infrastructure failure and the message is redelivered after a delay.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// Config bounds a Serve loop.
type Config struct {
	// Concurrency is the number of messages handled at once (default 64).
	Concurrency int
	// Grace is how long in-flight handlers may run after ctx ends before their context is
	// cancelled (default 10s).
	Grace time.Duration
	// NakDelay is the redelivery delay after an infrastructure failure (default 1s); it
	// doubles with each further delivery of the message, up to 30s.
	NakDelay time.Duration
	// MaxWait is how long a fetched message may wait for a free slot before it is handed
	// back instead of handled (default 10s). It must be well under the consumer's
	// AckWait: a message that waited past AckWait may already be redelivered to another
	// worker, and handling both copies would run a call twice.
	MaxWait time.Duration
	Logger  *slog.Logger
	// Observer, when set, is told when the loop serves and stops and about redeliveries
	// and terminated poison messages (metrics, readiness). nil observes nothing.
	Observer Observer
	// Doorbell, when set, lets idle queues stop pulling until it rings (park.go); nil
	// keeps every queue pulling.
	Doorbell Doorbell
	// ParkAfter is how long a queue must be idle before it parks (default
	// DefaultParkAfter), ParkCheck how often a parked queue asks the server whether
	// something waits for it all the same (default DefaultParkCheck).
	ParkAfter, ParkCheck time.Duration
}

// Observer watches Serve loops; implementations must be safe for concurrent use and
// cheap (they run on the delivery path). The consumer argument is its durable name.
type Observer interface {
	// Serving is called once the loop consumes from every one of its consumers.
	Serving(consumers []string)
	// Stopped is called when the loop returns.
	Stopped(consumers []string)
	// Redelivered is called for a message delivered more than once.
	Redelivered(consumer string)
	// Terminated is called for a poison message the loop terminated.
	Terminated(consumer string)
}

// nopObserver is the observer of a loop configured without one.
type nopObserver struct{}

func (nopObserver) Serving([]string)   {}
func (nopObserver) Stopped([]string)   {}
func (nopObserver) Redelivered(string) {}
func (nopObserver) Terminated(string)  {}

// Serve consumes messages until ctx ends, handling at most cfg.Concurrency at once (the
// pool blocks intake when full: back-pressure). On ctx end it stops intake, waits up to
// cfg.Grace for in-flight handlers, then cancels their context and waits for them.
// Messages fetched but not handled are redelivered by the server after AckWait.
func Serve(ctx context.Context, cons jetstream.Consumer, cfg Config, h Handler) error {
	return ServeAll(ctx, []jetstream.Consumer{cons}, cfg, h)
}

// PullExpiry is how long a pull request of a consume loop waits on the server, and
// pullHeartbeat how often the server tells a waiting one that it is alive; the client
// pulls again when a request expires and after two missed heartbeats (60 s), the last
// resort when a loop lost its pull without a word from the server (see stallSilence for
// the first: the race of nats.go at saturation; a reconnection re-pulls at once). A
// bound but idle queue costs one renewal per expiry (client to server) and one heartbeat
// per period (server to client): with 2,000 queues bound (1,000 tools served by two
// deployments each), 17 and 67 messages a second, where 30 s and 5 s cost 67 and 400
// (docs/performance.md, "Idle queues"), unless the queues park (park.go).
const (
	PullExpiry    = 2 * time.Minute
	pullHeartbeat = 30 * time.Second
)

// A consume loop of nats.go (v1.55.0, jetstream.Consumer.Consume) can lose its pull: it
// pulls again when its count of messages still due falls below half its batch, but
// skips that check while its previous pull request is being published (fetchInProgress).
// When the goroutine that publishes is descheduled long enough for the server to answer
// that request and for the loop to handle every message it was owed (a busy machine at
// saturation: seen within milliseconds), the count reaches zero while no check may pull,
// and no further message comes to make one: the loop waits, the server holds no pull
// for it, and the queue behind it stops until the missed heartbeats (2 x pullHeartbeat)
// make the client pull again. That was the collapse of the bench at saturation (a run
// at a few percent of the floor). The loops watch for it themselves: a loop that
// handled at least stallBurst messages, then got nothing for stallSilence while it had
// free slots, asks the server for its consumer's state (one request per such silence,
// none while idle: the next check needs stallBurst new messages), and when no pull is
// waiting there and the server delivered nothing during the silence (so nothing is on
// its way to the loop) it starts a new consume loop on the consumer; the old one is
// drained once it delivered nothing for stallSilence more.
const (
	stallSilence = 500 * time.Millisecond
	stallBurst   = 8
)

// PullObserver is implemented by an Observer that wants to know when a loop pulled again
// because the server held no pull for it (a loop that would have stalled until its
// heartbeats were missed).
type PullObserver interface {
	PullRestarted(consumer string)
}

// feed is one consumer of a ServeAll loop: its current consume context and what the
// stall watch needs to know of it.
type feed struct {
	cons jetstream.Consumer
	name string
	mu   sync.Mutex // guards cc, retired and stopped
	cc   jetstream.ConsumeContext
	// ccLast is when cc last delivered (unix ns).
	ccLast *atomic.Int64
	// retired are the contexts replaced by a new one: each is drained once it delivered
	// nothing for stallSilence (unsubscribing a context whose pull the server is filling
	// would send that batch nowhere, back only after AckWait).
	retired []retiredContext
	// nretired is len(retired), read without the lock: the watch's check of an idle
	// feed (most feeds of a process bound to many queues) is one atomic load.
	nretired atomic.Int32
	// stopped is set when the loop ends: no consume context is started after it.
	stopped bool
	// inCallback counts the deliveries being handed to the pool (one at a time unless a
	// retired context is still delivering), last is when one last entered or left
	// (unix ns), burst counts the messages since the last check.
	inCallback atomic.Int32
	last       atomic.Int64
	burst      atomic.Int64
	// parked is set while the queue does not pull (park.go), bell stops its doorbell
	// (under mu); rung is set by the doorbell. The watch alone uses the rest: missed is
	// the doorbell's Missed when the queue parked, nextCheck when a parked queue asks
	// the server next, retryAt and retryDelay when and after how long a queue whose
	// pulling again failed tries again.
	parked     atomic.Bool
	bell       func()
	rung       atomic.Bool
	missed     uint64
	nextCheck  time.Time
	retryAt    time.Time
	retryDelay time.Duration
}

// retiredContext is a consume context replaced by a new one, and when it last
// delivered or was replaced (unix ns).
type retiredContext struct {
	cc   jetstream.ConsumeContext
	last *atomic.Int64
}

// drainRetired drains the retired contexts that delivered nothing for stallSilence.
func (f *feed) drainRetired(now int64) {
	if f.nretired.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := f.retired[:0]
	for _, r := range f.retired {
		if now-r.last.Load() >= int64(stallSilence) {
			r.cc.Drain()
			continue
		}
		kept = append(kept, r)
	}
	f.retired = kept
	f.nretired.Store(int32(len(kept)))
}

// Puller is a consumer that pulls by itself and whose state cannot be asked (a team's
// queue, teamqueue.Consumer: the core exports no consumer info to a team, see
// events/teamqueue). Its loop neither watches for a lost pull (it pulls again on
// the server's every answer and after two missed heartbeats) nor parks (it cannot ask
// whether anything is unacknowledged, which no doorbell rings for).
type Puller interface {
	ConsumePulls(h jetstream.MessageHandler, batch int, expiry, heartbeat time.Duration, onErr func(error)) (jetstream.ConsumeContext, error)
}

// ServeAll is Serve over several consumers (an executor's tool queues) sharing one
// concurrency limit. Each consumer buffers at most a fair share of the limit, so a
// message rarely waits in the client for a slot.
func ServeAll(ctx context.Context, consumers []jetstream.Consumer, cfg Config, h Handler) error {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 10 * time.Second
	}
	if cfg.NakDelay <= 0 {
		cfg.NakDelay = time.Second
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	names := make([]string, 0, len(consumers))
	for _, cons := range consumers {
		names = append(names, cons.CachedInfo().Name)
	}
	// Handlers get a context that outlives ctx by the grace period.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	l := &serveLoop{cfg: cfg, h: h, workCtx: workCtx, p: newWorkers(cfg.Concurrency),
		share: max(1, cfg.Concurrency/len(consumers)), wake: make(chan struct{}, 1),
		parkAfter: cmp.Or(cfg.ParkAfter, DefaultParkAfter), parkCheck: cmp.Or(cfg.ParkCheck, DefaultParkCheck)}
	defer l.stopFeeds()
	for i, cons := range consumers {
		f := &feed{cons: cons, name: names[i]}
		f.last.Store(time.Now().UnixNano()) // idle from now on, as far as parking goes
		if err := l.start(f); err != nil {
			return err
		}
		l.feeds = append(l.feeds, f)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		l.watch(watchCtx)
	}()
	cfg.Observer.Serving(names)
	defer cfg.Observer.Stopped(names)
	<-ctx.Done()
	stopWatch()
	<-watched
	l.stopFeeds()
	l.finish(cancelWork)
	return nil
}

// serveLoop is the state of a ServeAll: the pool its consumers share and their feeds.
type serveLoop struct {
	cfg     Config
	h       Handler
	workCtx context.Context
	p       *workers
	share   int
	feeds   []*feed
	gate    sync.RWMutex
	closed  bool         // under gate: the pool takes no more work
	busy    atomic.Int64 // handlers running: the pool has free slots while below Concurrency
	// wake wakes the watch when a parked queue's doorbell rings.
	wake                 chan struct{}
	parkAfter, parkCheck time.Duration
	bellRefused          bool // a doorbell was refused: no queue of the loop parks
}

// start starts a consume loop on f's consumer (again, when the stall watch found its
// pull lost: the previous one then drains).
func (l *serveLoop) start(f *feed) error {
	last := new(atomic.Int64)
	deliver := func(msg jetstream.Msg) { l.deliver(f, last, msg) }
	onErr := func(err error) { l.cfg.Logger.Debug("consume " + f.name + ": " + err.Error()) }
	var cc jetstream.ConsumeContext
	var err error
	if pc, ok := f.cons.(Puller); ok {
		cc, err = pc.ConsumePulls(deliver, l.share, PullExpiry, pullHeartbeat, onErr)
	} else {
		cc, err = f.cons.Consume(deliver, jetstream.PullMaxMessages(l.share), jetstream.PullExpiry(PullExpiry), jetstream.PullHeartbeat(pullHeartbeat),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { onErr(err) }))
	}
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		cc.Stop()
		return nil
	}
	if f.cc != nil {
		// Retired, drained once silent (drainRetired): whatever it is delivered until
		// then is still handled.
		f.retired = append(f.retired, retiredContext{cc: f.cc, last: f.ccLast})
		f.nretired.Store(int32(len(f.retired)))
		f.ccLast.Store(time.Now().UnixNano())
	}
	f.cc, f.ccLast = cc, last
	return nil
}

// deliver hands a delivered message to the pool, blocking while the pool is full
// (back-pressure), and keeps f's figures for the stall watch.
func (l *serveLoop) deliver(f *feed, ccLast *atomic.Int64, msg jetstream.Msg) {
	received := time.Now()
	f.inCallback.Add(1)
	f.last.Store(received.UnixNano())
	ccLast.Store(received.UnixNano())
	f.burst.Add(1)
	defer func() {
		f.last.Store(time.Now().UnixNano())
		f.inCallback.Add(-1)
	}()
	// A message delivered while the loop stops goes back at once: the pool takes no
	// work once it is being waited on.
	l.gate.RLock()
	defer l.gate.RUnlock()
	if l.closed {
		_ = msg.Nak()
		return
	}
	l.p.Go(func() {
		l.busy.Add(1)
		defer l.busy.Add(-1)
		if waited := time.Since(received); waited > l.cfg.MaxWait {
			// Too old to trust: hand it back to be delivered again.
			l.cfg.Logger.Debug("message waited too long for a slot, handed back", "subject", msg.Subject(), "waited", waited)
			_ = msg.Nak()
			return
		}
		dispatch(l.workCtx, l.cfg.Logger, l.cfg.Observer, l.cfg.NakDelay, l.h, msg)
	})
}

// stopFeeds stops every feed's consume loop; none starts after it. It drains them
// rather than stopping them: what the server already sent reaches deliver, which hands
// it back once the pool is closed (finish), where a stop dropped the client's buffer and
// left each of those messages unacknowledged until its AckWait (30 s by default).
func (l *serveLoop) stopFeeds() {
	for _, f := range l.feeds {
		f.mu.Lock()
		f.stopped = true
		if f.cc != nil {
			f.cc.Drain()
		}
		for _, r := range f.retired {
			r.cc.Drain()
		}
		f.retired = nil
		f.nretired.Store(0)
		if f.bell != nil {
			f.bell()
			f.bell = nil
		}
		f.mu.Unlock()
	}
}

// finish closes the pool to new work and waits up to cfg.Grace for in-flight handlers,
// then cancels their context and waits for them.
func (l *serveLoop) finish(cancelWork context.CancelFunc) {
	done := make(chan struct{})
	go func() {
		l.gate.Lock() // waits for a callback blocked on a full pool: the grace below covers it
		l.closed = true
		l.gate.Unlock()
		l.p.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(l.cfg.Grace):
		l.cfg.Logger.Warn("grace period over, cancelling in-flight work")
		cancelWork()
		<-done
	}
}

// watch checks, every half stallSilence until ctx ends, whether a feed that was busy
// went silent while the pool has free slots (see stallSilence), and then whether the
// server still holds a pull for it; when it holds none, it starts the feed again. With
// a Doorbell it also parks idle feeds and wakes parked ones (park.go), at once when a
// doorbell rings.
func (l *serveLoop) watch(ctx context.Context) {
	feeds, start, log, obs := l.feeds, l.start, l.cfg.Logger, l.cfg.Observer
	freeSlots := func() bool { return l.busy.Load() < int64(l.cfg.Concurrency) }
	t := time.NewTicker(stallSilence / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.wake:
		}
		wall := time.Now()
		now := wall.UnixNano()
		var missed uint64
		if l.cfg.Doorbell != nil {
			missed = l.cfg.Doorbell.Missed()
		}
		for _, f := range feeds {
			if _, ok := f.cons.(Puller); ok {
				continue // it pulls by itself and cannot ask the consumer's state: no stall watch, no parking
			}
			if l.cfg.Doorbell != nil {
				if f.parked.Load() {
					l.parked(ctx, f, wall, missed)
					continue
				}
				l.park(ctx, f, wall)
				if f.parked.Load() {
					continue
				}
			}
			f.drainRetired(now)
			if f.burst.Load() < stallBurst || f.inCallback.Load() > 0 || now-f.last.Load() < int64(stallSilence) || !freeSlots() {
				continue
			}
			f.burst.Store(0)
			ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ci, err := f.cons.Info(ictx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				// Look again at the next tick (a consumer being re-created, a slow
				// server); a consumer that is gone for good stops the checks soon
				// enough: its loop gets no message to re-arm them.
				log.Debug("consume "+f.name+": consumer state unknown", "error", err)
				if !errors.Is(err, jetstream.ErrConsumerNotFound) {
					f.burst.Store(stallBurst)
				}
				continue
			}
			if ci.NumWaiting > 0 {
				continue // a pull waits (this loop's, or another process's on a shared queue)
			}
			if last := ci.Delivered.Last; last != nil && ci.TimeStamp.Sub(*last) < stallSilence {
				// The server delivered during the silence (both times are its own): the
				// loop's last pulls were just filled and their messages are on their way
				// (or another process took them). Not a stall; look again after a
				// silence from now.
				f.last.Store(time.Now().UnixNano())
				f.burst.Store(stallBurst)
				continue
			}
			log.Warn("consume: the server holds no pull for this loop, pulling again", "consumer", f.name, "pending", ci.NumPending)
			if po, ok := obs.(PullObserver); ok {
				po.PullRestarted(f.name)
			}
			if err := start(f); err != nil {
				log.Warn("consume: pulling again failed", "consumer", f.name, "error", err)
				f.burst.Store(stallBurst) // try again at the next tick
			}
		}
	}
}

func dispatch(ctx context.Context, log *slog.Logger, obs Observer, nakDelay time.Duration, h Handler, msg jetstream.Msg) {
	md, merr := msg.Metadata()
	if merr == nil && md.NumDelivered > 1 {
		obs.Redelivered(md.Consumer)
	}
	// Every event the handler publishes names this one as its previous (events/seal).
	err := safeHandle(seal.WithParent(ctx, msg.Headers(), msg.Data()), h, msg)
	var deferred *DeferError
	switch {
	case errors.Is(err, ErrHeld):
	case errors.As(err, &deferred):
		log.Debug("message handed back", "subject", msg.Subject(), "reason", deferred.Reason, "delay", deferred.Delay)
		if nerr := msg.NakWithDelay(deferred.Delay); nerr != nil {
			log.Warn("nak failed", "subject", msg.Subject(), "error", nerr)
		}
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			log.Warn("ack failed", "subject", msg.Subject(), "error", aerr)
		}
	case errors.Is(err, events.ErrPoison) || errors.Is(err, events.ErrNotCloudEvent):
		// A message the server copied from another stream (a tool's queue) names where it
		// was published, which the operator looks up in the event stream.
		if src := msg.Headers().Get(events.StreamSourceHeader); src != "" {
			log.Error("poison message terminated", "subject", msg.Subject(), "source", src, "reason", err)
		} else {
			log.Error("poison message terminated", "subject", msg.Subject(), "reason", err)
		}
		if merr == nil {
			obs.Terminated(md.Consumer)
		}
		if terr := msg.TermWithReason(truncate(err.Error(), 200)); terr != nil {
			log.Warn("term failed", "subject", msg.Subject(), "error", terr)
		}
	default:
		// Back off with the deliveries so far: every delivery counts toward MaxDeliver, and
		// a bus outage (a cluster leader election takes seconds) must not use them all up.
		delay := nakDelay
		if merr == nil && md.NumDelivered > 1 {
			delay = min(nakDelay<<min(md.NumDelivered-1, 5), max(nakDelay, 30*time.Second))
		}
		log.Warn("handler failed, redelivering", "subject", msg.Subject(), "error", err, "delay", delay)
		if nerr := msg.NakWithDelay(delay); nerr != nil {
			log.Warn("nak failed", "subject", msg.Subject(), "error", nerr)
		}
	}
}

// safeHandle runs h and turns a panic into a poison error: the message is terminated
// with the panic as reason instead of killing the process or staying unacknowledged
// (which would hold a slot of MaxAckPending and block the queue behind it).
func safeHandle(ctx context.Context, h Handler, msg jetstream.Msg) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: handler panic: %v", events.ErrPoison, r)
		}
	}()
	return h(ctx, msg)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Heartbeat tells the server every period that msg is still being worked on, so work
// longer than the consumer's AckWait is not redelivered while its worker is alive.
// Call stop when the work ends.
func Heartbeat(msg jetstream.Msg, period time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() { close(done) }
}

// ErrHeld, returned by a handler, says that the handler keeps the message: it
// acknowledges it (or hands it back) itself, later. The loop neither acknowledges nor
// hands it back, and its slot of Concurrency is free at once; until the handler answers
// for it, the message holds a slot of the consumer's MaxAckPending, and the server
// redelivers it after the consumer's AckWait if nobody answered (the handler's process
// died).
var ErrHeld = errors.New("consume: the handler keeps the message")

// DeferError hands a message back to be delivered again after Delay, without the
// failure backoff and without a warning: the work is fine but must wait (a run at its
// cap of calls in flight).
type DeferError struct {
	Delay  time.Duration
	Reason string
}

func (e *DeferError) Error() string { return "deferred: " + e.Reason }
