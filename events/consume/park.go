package consume

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/connect"
)

// A bound queue that is idle still costs the server its pull: a heartbeat every
// pullHeartbeat and a renewal every PullExpiry, per queue and per process (2,000 of
// them for 1,000 tools served by two deployments each). A loop with a Doorbell parks a
// queue that delivered nothing for Config.ParkAfter: it listens to the doorbell, asks
// the server whether anything is pending or unacknowledged on the consumer and, if
// nothing is, stops pulling. A parked queue costs nothing until the doorbell rings (a
// message was published on its filter) or the connection reconnects (rings may have
// been lost meanwhile); it then pulls again. Redeliveries publish nothing, so a queue
// with anything unacknowledged (another worker's call, which the server redelivers if
// that worker dies) does not park. A parked queue asks the server again after
// ParkRecheck (a message published before the doorbell listened but stored after the
// first answer, or stored through another server of a cluster before that one knew of
// the doorbell) and then every Config.ParkCheck: the last resort for a ring lost some
// other way, so whatever happens to its rings a parked queue serves what waits for it
// within ParkCheck.

// DefaultParkAfter and DefaultParkCheck are the defaults of Config.ParkAfter and
// Config.ParkCheck; ParkRecheck is when a queue asks the server again after parking.
const (
	DefaultParkAfter = PullExpiry
	DefaultParkCheck = 15 * PullExpiry
	ParkRecheck      = time.Second
)

// Doorbell tells parked queues that work may have come for them (Config.Doorbell).
type Doorbell interface {
	// Listen calls ring, which must not block, whenever a message may have been
	// published for cons, until stop is called. It returns once the server listens; an
	// error (ErrDoorbellRefused when the credentials may not listen) leaves the queue
	// pulling.
	Listen(ctx context.Context, cons jetstream.Consumer, ring func()) (stop func(), err error)
	// Missed changes whenever rings may have been lost (the connection reconnected):
	// every parked queue then pulls again.
	Missed() uint64
}

// ParkObserver is implemented by an Observer that wants to know when a queue parks and
// when it pulls again.
type ParkObserver interface {
	Parked(consumer string, parked bool)
}

// ErrDoorbellRefused is returned by a Doorbell whose listener the server refused.
var ErrDoorbellRefused = errors.New("consume: the server refused the doorbell")

// NewSubjectDoorbell returns the Doorbell of consumers on nc: a core subscription to the
// consumer's filter subjects, so any message published for it rings. The credentials
// need subscribe permission on those subjects (deploy/nats/permissions.conf); without
// it queues never park.
func NewSubjectDoorbell(nc *nats.Conn) Doorbell { return subjectDoorbell{nc: nc} }

// NewPublishedDoorbell is NewSubjectDoorbell for consumers of a stream that nothing is
// published to (one the server fills from another's, with a subject transform):
// publishedOn maps each filter of a consumer to the subject its messages are published
// on, which the doorbell listens to.
func NewPublishedDoorbell(nc *nats.Conn, publishedOn func(filter string) string) Doorbell {
	return subjectDoorbell{nc: nc, publishedOn: publishedOn}
}

type subjectDoorbell struct {
	nc          *nats.Conn
	publishedOn func(filter string) string
}

func (d subjectDoorbell) Listen(ctx context.Context, cons jetstream.Consumer, ring func()) (func(), error) {
	cfg := cons.CachedInfo().Config
	subjects := slices.Clone(cfg.FilterSubjects)
	if cfg.FilterSubject != "" {
		subjects = append(subjects, cfg.FilterSubject)
	}
	if len(subjects) == 0 {
		return nil, fmt.Errorf("consume: consumer %s has no filter to listen to", cons.CachedInfo().Name)
	}
	if d.publishedOn != nil {
		for i, f := range subjects {
			subjects[i] = d.publishedOn(f)
		}
	}
	subs := make([]*nats.Subscription, 0, len(subjects))
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe() // the connection may be closing
		}
	}
	for _, subj := range subjects {
		s, err := d.nc.Subscribe(subj, func(*nats.Msg) { ring() })
		if err != nil {
			stop()
			return nil, fmt.Errorf("consume: doorbell %s: %w", subj, err)
		}
		// The ring's body is a whole message: a limit could drop it.
		_ = s.SetPendingLimits(-1, -1)
		subs = append(subs, s)
	}
	if err := d.nc.FlushWithContext(ctx); err != nil {
		stop()
		return nil, fmt.Errorf("consume: doorbell: %w", err)
	}
	if err := connect.SubscribeRefused(d.nc, subjects...); err != nil {
		stop()
		return nil, fmt.Errorf("%w: %w", ErrDoorbellRefused, err)
	}
	return stop, nil
}

func (d subjectDoorbell) Missed() uint64 { return d.nc.Stats().Reconnects }

// park makes f a parked queue if it has been idle for ParkAfter and nothing is pending
// or unacknowledged on its consumer. Only the watch calls it (and parked and unpark).
func (l *serveLoop) park(ctx context.Context, f *feed, now time.Time) {
	if l.bellRefused || f.inCallback.Load() > 0 || f.nretired.Load() > 0 || now.UnixNano()-f.last.Load() < int64(l.parkAfter) {
		return
	}
	missed := l.cfg.Doorbell.Missed()
	f.rung.Store(false)
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	stop, err := l.cfg.Doorbell.Listen(lctx, f.cons, func() {
		f.rung.Store(true)
		select {
		case l.wake <- struct{}{}:
		default:
		}
	})
	cancel()
	if err != nil && !errors.Is(err, ErrDoorbellRefused) {
		// Try again once idle for as long again (a slow or reconnecting server).
		f.last.Store(now.UnixNano())
		if ctx.Err() == nil {
			l.cfg.Logger.Debug("consume: cannot park the queue", "consumer", f.name, "error", err)
		}
		return
	}
	if err != nil {
		// The credentials predate the doorbells: no queue of this loop tries again (each
		// refusal is a permission violation the process reports).
		l.bellRefused = true
		l.cfg.Logger.Warn("consume: idle queues keep pulling (grant the credentials subscribe permission on their filters: deploy/nats/permissions.conf)", "consumer", f.name, "error", err)
		return
	}
	// Asked once the doorbell listens: a call published after this rings it.
	if !l.nothingWaits(ctx, f) {
		// Work is on its way or unacknowledged (another worker's, a redelivery to
		// come): keep pulling, look again once idle for as long again.
		stop()
		f.last.Store(now.UnixNano())
		return
	}
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		stop()
		return
	}
	cc := f.cc
	f.cc, f.bell, f.missed = nil, stop, missed
	f.parked.Store(true)
	f.mu.Unlock()
	if cc != nil {
		// Drained, not stopped: a call the server handed to this pull before it heard
		// of the unsubscription (between the answer above and now) is still handled,
		// where a stop would drop it until the ack wait redelivered it.
		cc.Drain()
	}
	if po, ok := l.cfg.Observer.(ParkObserver); ok {
		po.Parked(f.name, true)
	}
	// A ring since Listen wakes it at the next tick; a call stored after the answer
	// but published before the doorbell listened is found by the check at ParkRecheck.
	f.nextCheck = now.Add(ParkRecheck)
}

// parked looks after a parked queue: it pulls again when rung, when rings may have been
// missed (missed, the doorbell's Missed read once per tick, differs from the one it
// parked with), and when the server holds something for it at a check.
func (l *serveLoop) parked(ctx context.Context, f *feed, now time.Time, missed uint64) {
	switch {
	case f.rung.Load():
		if now.Before(f.retryAt) {
			return // pulling again failed a moment ago
		}
		l.unpark(f, "rung")
	case missed != f.missed:
		l.unpark(f, "reconnected")
	case now.After(f.nextCheck):
		// Spread the checks of queues parked together.
		f.nextCheck = now.Add(l.parkCheck/2 + rand.N(l.parkCheck/2+1))
		if !l.nothingWaits(ctx, f) {
			l.unpark(f, "work waits")
		}
	}
}

// nothingWaits reports whether the server has nothing pending or unacknowledged on f's
// consumer (false when it cannot tell).
func (l *serveLoop) nothingWaits(ctx context.Context, f *feed) bool {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ci, err := f.cons.Info(ictx)
	return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
}

// unpark makes f pull again.
func (l *serveLoop) unpark(f *feed, why string) {
	f.mu.Lock()
	bell := f.bell
	f.bell = nil
	f.parked.Store(false)
	f.mu.Unlock()
	if bell != nil {
		bell()
	}
	f.rung.Store(false)
	f.last.Store(time.Now().UnixNano())
	l.cfg.Logger.Debug("consume: queue pulls again", "consumer", f.name, "why", why)
	if po, ok := l.cfg.Observer.(ParkObserver); ok {
		po.Parked(f.name, false)
	}
	if err := l.start(f); err != nil {
		// Parked again, without a doorbell, with a ring pending: tried again after a
		// delay that doubles with each failure, up to stallSilence x 60 (30 s).
		f.retryDelay = min(max(2*f.retryDelay, stallSilence), 60*stallSilence)
		f.retryAt = time.Now().Add(f.retryDelay)
		l.cfg.Logger.Warn("consume: pulling again failed", "consumer", f.name, "error", err, "retry in", f.retryDelay)
		f.parked.Store(true)
		f.rung.Store(true)
		return
	}
	f.retryDelay = 0
}
