package worker

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestLease: a renewed lease holds and does not fire; left unrenewed it runs out at
// start + TTL - margin (before the server could expire the record, at start + TTL) and
// fires once.
func TestLease(t *testing.T) {
	var fired atomic.Int32
	l := newLease(2*time.Second, func() { fired.Add(1) })
	if l.valid() {
		t.Fatal("a lease never renewed must not be valid")
	}
	start := time.Now()
	l.renewed(start)
	if d := l.Deadline(); !d.Equal(start.Add(2*time.Second-l.margin)) || l.margin <= 0 {
		t.Fatalf("deadline %v, want start + TTL - margin (margin %v)", d.Sub(start), l.margin)
	}
	// An older renewal acknowledged late never moves the deadline back.
	l.renewed(start.Add(-time.Second))
	if !l.Deadline().Equal(start.Add(2*time.Second - l.margin)) {
		t.Fatal("deadline moved back")
	}
	for time.Since(start) < 3*time.Second { // renewed well within the TTL: holds
		l.renewed(time.Now())
		if !l.valid() {
			t.Fatal("renewed lease not valid")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := fired.Load(); n != 0 {
		t.Fatalf("a renewed lease fired %d times", n)
	}
	last := time.Now()
	l.renewed(last)
	for fired.Load() == 0 {
		if time.Since(last) > time.Minute {
			t.Fatal("unrenewed lease never fired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if l.valid() || time.Now().Before(l.Deadline()) {
		t.Fatal("fired but still valid")
	}
	if time.Since(last) < 2*time.Second-l.margin {
		t.Fatal("fired before its deadline")
	}
	time.Sleep(100 * time.Millisecond)
	if n := fired.Load(); n != 1 {
		t.Fatalf("fired %d times, want once", n)
	}
	l.stop()
}

// TestLeaseLapseIsFinalForItsCalls: a call that started under a lease that then
// lapsed (a pause: no renewal reached the server in time) holds nothing even once
// renewals resume, whatever notices the lapse first (the timer, or the late renewal);
// a call started after the renewal holds the new lease.
func TestLeaseLapseIsFinalForItsCalls(t *testing.T) {
	for _, timerFirst := range []bool{true, false} {
		var fired atomic.Int32
		l := newLease(time.Second, func() { fired.Add(1) })
		l.renewed(time.Now())
		if !timerFirst {
			l.timer.Stop() // as if the process resumed and the renewal ran before the timer
		}
		before := l.view()
		if !before.valid() {
			t.Fatal("fresh lease not valid")
		}
		for time.Now().Before(l.Deadline()) {
			time.Sleep(10 * time.Millisecond)
		}
		if before.valid() {
			t.Fatal("valid past its deadline")
		}
		if timerFirst {
			for fired.Load() == 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		l.renewed(time.Now()) // renewals resume
		if n := fired.Load(); n != 1 {
			t.Fatalf("timer first %v: lapse reported %d times, want once", timerFirst, n)
		}
		if before.valid() || !before.Deadline().IsZero() {
			t.Fatalf("timer first %v: a call from before the lapse holds the lease again", timerFirst)
		}
		if after := l.view(); !after.valid() {
			t.Fatalf("timer first %v: a call after the renewal does not hold the lease", timerFirst)
		}
		l.stop()
	}
}
