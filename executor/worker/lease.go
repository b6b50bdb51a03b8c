package worker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"
)

// The lease. A worker holds the calls it claimed by its instance record, which it
// renews every leaseRenewEvery (a fifth of the instance TTL) and which the bucket
// expires TTL after the last renewal that reached the server. Another executor takes a
// claim over only once that record is gone, so not before
//
//	last stored renewal + TTL  ≥  start of the last acknowledged renewal + TTL.
//
// The worker's own lease deadline is earlier:
//
//	start of the last acknowledged renewal + TTL − margin   (margin = TTL/5)
//
// measured on its monotonic clock, which also runs while the process is stopped
// (SIGSTOP, a frozen VM) or cut off. At that deadline the contexts of its running calls
// are cancelled (cause errLeaseLost), no new call starts, a result not yet stored is
// not published, and each such claim is marked abandoned so that the next delivery
// runs the call again at once. The margin absorbs the drift between the executor's and
// the server's clocks over one TTL (rates, not offsets: only durations are compared)
// and leaves a cooperative tool time to stop. A tool checks CallInfo.LeaseValid before
// an irreversible step; one that ignores both its context and its lease is the only
// way a call's side effect can happen twice.

// errLeaseLost is the cancellation cause of calls whose executor could not renew its
// lease in time, and the error of a handling that stopped for it.
var errLeaseLost = errors.New("executor: lease lost (instance heartbeat not renewed in time): the call is handed back")

// lease is a worker's hold on its claims. A lapse (the deadline passed before a
// renewal) ends it for every call that started under it, even once renewals resume:
// those calls see it through a leaseView, which implements executor.Lease.
type lease struct {
	ttl, margin time.Duration
	onExpire    func() // called once per lapse, when it is noticed

	mu    sync.Mutex
	until time.Time // monotonic; zero before the first renewal
	// serverUntil is the lease deadline by the server's clock (stamp), or zero when
	// no renewal's stored time is known: what results carry as LeaseUntil.
	serverUntil time.Time
	gen         uint64 // lapses so far
	down        bool   // lapsed and not renewed since
	timer       *time.Timer
	stopped     bool
}

// leaseView is the lease as one call holds it: valid while the lease has not lapsed
// since the call started.
type leaseView struct {
	l   *lease
	gen uint64
}

// view returns the lease as a call starting now holds it.
func (l *lease) view() leaseView {
	l.mu.Lock()
	defer l.mu.Unlock()
	return leaseView{l, l.gen}
}

// Deadline implements executor.Lease: when the lease runs out unless renewed, or the
// zero time once it lapsed since the call started.
func (v leaseView) Deadline() time.Time {
	v.l.mu.Lock()
	defer v.l.mu.Unlock()
	if v.l.gen != v.gen {
		return time.Time{}
	}
	return v.l.until
}

// valid reports whether the call still holds the lease.
func (v leaseView) valid() bool { return time.Now().Before(v.Deadline()) }

// serverDeadline is the lease deadline by the server's clock, or zero once the lease
// lapsed since the call started (or when no renewal's stored time is known).
func (v leaseView) serverDeadline() time.Time {
	v.l.mu.Lock()
	defer v.l.mu.Unlock()
	if v.l.gen != v.gen || v.l.down {
		return time.Time{}
	}
	return v.l.serverUntil
}

// lapseLocked records a lapse noticed now; it reports whether it is a new one.
func (l *lease) lapseLocked() bool {
	if l.down || l.until.IsZero() || time.Now().Before(l.until) {
		return false
	}
	l.down = true
	l.gen++
	return true
}

func newLease(ttl time.Duration, onExpire func()) *lease {
	return &lease{ttl: ttl, margin: ttl / 5, onExpire: onExpire}
}

// renewEvery is the period of the heartbeats that renew the lease: a fifth of the TTL,
// so the lease survives three renewals in a row that fail or are late.
func (l *lease) renewEvery() time.Duration { return max(l.ttl/5, 20*time.Millisecond) }

// renewed records a renewal acknowledged by the server that was sent at start. A
// renewal acknowledged after the deadline passed (the process was paused, or cut off)
// is a lapse all the same: the calls under the old lease are lost.
func (l *lease) renewed(start time.Time) {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	lapsed := l.lapseLocked()
	if until := start.Add(l.ttl - l.margin); until.After(l.until) {
		l.until = until
		if time.Now().Before(until) {
			l.down = false
		}
		if l.timer == nil {
			l.timer = time.AfterFunc(time.Until(until), l.fire)
		} else {
			l.timer.Reset(time.Until(until))
		}
	}
	l.mu.Unlock()
	if lapsed {
		l.onExpire()
	}
}

// stamp records, for a renewal sent at start and acknowledged rtt later, the time
// the server stored it (by its clock). The instance record expires one TTL after
// stored; the server-clock deadline is
//
//	stored + TTL − margin − rtt
//
// which is not later, in real time, than the monotonic deadline the renewal set
// (start + TTL − margin): the server stored it at most rtt after it was sent. So a
// result the stream stored before it was stored while this lease held, with no clock
// offset between executor and server involved.
func (l *lease) stamp(stored time.Time, rtt time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if until := stored.Add(l.ttl - l.margin - rtt); until.After(l.serverUntil) {
		l.serverUntil = until
	}
}

// fire runs when the timer set for the deadline goes off: if no renewal moved the
// deadline meanwhile, the lease is lost.
func (l *lease) fire() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	if wait := time.Until(l.until); wait > 0 { // renewed meanwhile
		l.timer.Reset(wait)
		l.mu.Unlock()
		return
	}
	lapsed := l.lapseLocked()
	l.mu.Unlock()
	if lapsed {
		l.onExpire()
	}
}

// Deadline returns when the lease runs out unless renewed (zero before the first
// renewal: no lease).
func (l *lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// valid reports whether the lease holds now: a call claimed now cannot be taken over
// before the deadline.
func (l *lease) valid() bool { return time.Now().Before(l.Deadline()) }

// stop ends the lease (the worker stops and removes its instance record).
func (l *lease) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
	}
}

// newBootID returns a random id for this process start (part of the instance's
// identity, so a restart under the same name is a new instance).
func newBootID() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	return hex.EncodeToString(b[:])
}
