package fair

import (
	"math"
	"time"
)

// The release window: how many released calls of a tool may wait for an executor. A
// quiet tenant's call, released now, starts behind all of them, so the window is what
// it waits for under a flood; too small a window leaves the executors' slots idle
// between a claim and the next release. The "pace" window (the default) keeps just
// enough released to cover one release cycle at the rate the tool's calls start: the
// time from a claim heard to the next call released, stored and delivered is about
// three of the release's round trips (the claim's write, the release's publish and its
// store), and the executors start calls at the rate of their claims. The "running"
// window releases as many as the executors run (one round of their slots, up to
// maxLookahead): about a third of a wave of a flood's calls ahead of a quiet one.

// Window designs (Shares.Window).
const (
	windowPace    = "pace"
	windowRunning = "running"
)

// pace is what the window learns of a tool: the interval between its claims.
type pace struct {
	lastClaim time.Time
	interval  float64 // seconds between claims (moving average)
}

// claimed counts a claim heard at now.
func (p *pace) claimed(now time.Time) {
	if !p.lastClaim.IsZero() {
		dt := min(now.Sub(p.lastClaim).Seconds(), 1)
		if p.interval == 0 {
			p.interval = dt
		} else {
			p.interval = 0.9*p.interval + 0.1*dt
		}
	}
	p.lastClaim = now
}

// rate is the calls per second started lately (0: none for a second).
func (p *pace) rate(now time.Time) float64 {
	if p.interval == 0 || now.Sub(p.lastClaim) > time.Second {
		return 0
	}
	return 1 / max(p.interval, now.Sub(p.lastClaim).Seconds()/2, 1e-5)
}

// rtt is the scheduler's moving average of a release's round trip (publish to stored).
type rtt struct{ seconds float64 }

func (r *rtt) add(d time.Duration) {
	if r.seconds == 0 {
		r.seconds = d.Seconds()
		return
	}
	r.seconds = 0.9*r.seconds + 0.1*d.Seconds()
}

// paceWindow is the pace design's window for a tool starting calls at rate per second
// with a release round trip of rtt seconds: one release cycle (three round trips, at
// least a millisecond each) of calls, and one more.
func paceWindow(rate, rtt float64) int {
	cycle := 3 * max(rtt, 0.001)
	return int(math.Ceil(rate*cycle)) + 1
}
