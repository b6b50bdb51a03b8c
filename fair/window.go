package fair

import (
	"math"
	"time"
)

// The release window: how many released calls of a tool may wait for an executor. A
// quiet tenant's call, released now, starts behind all of them, so the window is what
// it waits for under a flood; too small a window leaves the executors' slots idle
// between a claim and the next release. The "pace" window keeps just
// enough released to cover one release cycle at the rate the tool's calls start: the
// cycle is the shortest time lately from a release to its claim (at least three of the
// release's round trips: the claim's write, the release's publish and its store), and
// the executors start calls at the rate of their claims; the one more it allows makes
// a window that holds the rate back grow until it does not. The "running"
// window releases as many as the executors run (one round of their slots, up to
// maxLookahead): about a third of a wave of a flood's calls ahead of a quiet one.

// Window designs (Shares.Window).
const (
	windowPace    = "pace"
	windowRunning = "running"
	windowCredit  = "credit"
)

// pace is what the window learns of a tool: the interval between its claims, and the
// shortest time lately from a release to its claim (a call that found a free slot: the
// release cycle itself, without waiting in line; it may grow 2% a claim, so it follows a
// machine that slows down).
type pace struct {
	lastClaim time.Time
	interval  float64 // seconds between claims (moving average)
	cycle     float64 // seconds, the decaying minimum of release to claim
}

// claimed counts a claim heard at now of a call released at released.
func (p *pace) claimed(now, released time.Time) {
	if d := now.Sub(released).Seconds(); !released.IsZero() && d >= 0 {
		if p.cycle == 0 || d < p.cycle*1.02 {
			p.cycle = d
		} else {
			p.cycle *= 1.02
		}
	}
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
// with a release cycle of cycle seconds measured and a release round trip of rtt: one
// release cycle (at least three round trips, at least a millisecond each) of calls, and
// one more.
func paceWindow(rate, cycle, rtt float64) int {
	cycle = max(cycle, 3*max(rtt, 0.001))
	return int(math.Ceil(rate*cycle)) + 1
}

// The "credit" window releases into the executors' free slots rather than ahead of
// them: a tool's capacity is the slots of its executors (their instance records'
// concurrency), and while it is known the window is the slots free of it. A busy tool's
// executors then hold no released call in line, and a quiet tenant's first call (sent
// at once past a full window) is the next to start: it waits for one slot to free, not
// behind the calls released before it; with a guaranteed minimum it finds its slot
// free (toolQueue.reserve). Each freed slot stays idle for one release cycle (heard
// finished, released, pulled, claimed: a few ms), a few percent of a call of
// creditMinRun or more; a tool whose calls are shorter keeps the pace window.

// creditMinRun is the shortest mean run time (claim to finish) of a tool's calls that
// the credit window serves from free slots only.
const creditMinRun = 0.05 // seconds

// credit is what the credit window learns of a tool: its capacity, and how long its
// calls run (claim to finish, moving average).
type credit struct {
	capacity int
	run      float64 // seconds
}

// ran counts a call that ran d (claim heard to finish heard).
func (c *credit) ran(d time.Duration) {
	if c.run == 0 {
		c.run = d.Seconds()
		return
	}
	c.run = 0.9*c.run + 0.1*d.Seconds()
}

// creditWindow is the credit design's window for a tool with running calls claimed and
// not finished, and reserve slots kept for the guaranteed minimums of tenants seen
// lately; ok is false while its capacity is unknown or its calls are short (the pace
// window then). Nothing is released ahead of a free slot: a window that adds calls for
// the release's round trip or its time to a claim grows as the executors' line and the
// server's load grow, which grows them further (measured: a runaway to 90 calls ahead).
func creditWindow(c credit, running, reserve int) (n int, ok bool) {
	if c.capacity == 0 || c.run < creditMinRun {
		return 0, false
	}
	return max(c.capacity-running-reserve, 0), true
}
