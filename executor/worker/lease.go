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

// lease is a worker's hold on its claims; it implements executor.Lease.
type lease struct {
	ttl, margin time.Duration
	onExpire    func() // called (from a timer goroutine) when the deadline passes unrenewed

	mu      sync.Mutex
	until   time.Time // monotonic; zero before the first renewal
	timer   *time.Timer
	stopped bool
}

func newLease(ttl time.Duration, onExpire func()) *lease {
	return &lease{ttl: ttl, margin: ttl / 5, onExpire: onExpire}
}

// renewEvery is the period of the heartbeats that renew the lease: a fifth of the TTL,
// so the lease survives three renewals in a row that fail or are late.
func (l *lease) renewEvery() time.Duration { return max(l.ttl/5, 20*time.Millisecond) }

// renewed records a renewal acknowledged by the server that was sent at start.
func (l *lease) renewed(start time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	until := start.Add(l.ttl - l.margin)
	if l.stopped || !until.After(l.until) {
		return
	}
	l.until = until
	if l.timer == nil {
		l.timer = time.AfterFunc(time.Until(until), l.fire)
	} else {
		l.timer.Reset(time.Until(until))
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
	l.mu.Unlock()
	l.onExpire()
}

// Deadline returns when the lease runs out unless renewed (zero before the first
// renewal: no lease).
func (l *lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// valid reports whether the lease holds now: no other executor can have taken over a
// call of this worker.
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
