package fair

import (
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
)

// call is one staged call.
type call struct {
	seq    uint64 // its sequence in the queue stream's staging subject
	tool   string // the tool's token
	name   string // the tool's name in the call (events.FairHeldToken: its held view)
	tenant string
	key    string // its claim key (store.ClaimKey), how executors' claims name it
	hdr    nats.Header
	data   []byte

	started  bool      // an executor claimed it
	released time.Time // when it was released
	claimed  time.Time // when its claim was heard
}

// toolQueue is one tool's calls: held per tenant, and released but not finished.
type toolQueue struct {
	held     map[string][]*call   // tenant -> FIFO
	pass     map[string]float64   // stride scheduling: the next pick is the lowest pass
	vtime    float64              // the pass of the last pick: where a returning tenant starts
	inFlight map[string]int       // tenant -> released, not finished
	waiting  int                  // released, no executor claimed it yet
	capped   map[string]bool      // tenants held by their cap (logged once per episode)
	pace     pace                 // the rate its calls start (window.go)
	credit   credit               // its executors' capacity (window.go)
	seen     map[string]time.Time // tenant -> when its last call was staged
}

func newToolQueue() *toolQueue {
	return &toolQueue{held: map[string][]*call{}, pass: map[string]float64{}, inFlight: map[string]int{}, capped: map[string]bool{}, seen: map[string]time.Time{}}
}

// hold queues c behind its tenant's held calls. A tenant whose queue was empty starts
// at the current virtual time: idleness earns no burst over the others.
func (q *toolQueue) hold(c *call) {
	if len(q.held[c.tenant]) == 0 && q.pass[c.tenant] < q.vtime {
		q.pass[c.tenant] = q.vtime
	}
	q.held[c.tenant] = append(q.held[c.tenant], c)
	q.seen[c.tenant] = time.Now()
}

// unhold puts c back at the front of its tenant's queue (its release failed).
func (q *toolQueue) unhold(c *call) {
	q.held[c.tenant] = append([]*call{c}, q.held[c.tenant]...)
}

// pick takes the next call to release, or nil: first a tenant under its guaranteed
// minimum (the furthest below it), then the tenant with the lowest pass (weighted round
// robin); a tenant at its cap is skipped. Ties go by name, so the order is reproducible.
//
// With idleOnly (the release window is full) a call goes only if the tenant whose turn
// it is has none of the tool in flight (ties go to such a tenant): its first call goes at
// once, one past the window, instead of waiting for room behind a busy tenant's
// releases (window.go). Any tenant with nothing in flight would not do: under the credit
// window, full at nearly every release, the tenants would then take turns whatever
// their weights (alice=3,bob=1 measured 1:1).
func (q *toolQueue) pick(p policy, tool string, idleOnly bool) *call {
	limit := p.capOf(tool)
	best, bestMin, bestIdle := "", false, false
	var bestKey float64
	for _, t := range q.tenants() {
		if limit > 0 && q.inFlight[t] >= limit {
			q.capped[t] = true
			continue
		}
		q.capped[t] = false
		under, idle := q.inFlight[t] < p.min(t), q.inFlight[t] == 0
		key := q.pass[t]
		if under {
			key = float64(q.inFlight[t]) / float64(p.min(t))
		}
		if best == "" || (under && !bestMin) || (under == bestMin && (key < bestKey || key == bestKey && idleOnly && idle && !bestIdle)) {
			best, bestMin, bestKey, bestIdle = t, under, key, idle
		}
	}
	if best == "" || (idleOnly && !bestIdle) {
		return nil
	}
	c := q.held[best][0]
	q.held[best] = q.held[best][1:]
	if len(q.held[best]) == 0 {
		delete(q.held, best)
	}
	if !bestMin {
		q.vtime = q.pass[best]
		q.pass[best] += 1 / p.weight(best)
	}
	q.inFlight[best]++
	q.waiting++
	return c
}

// tenants are the tenants with held calls, sorted.
func (q *toolQueue) tenants() []string {
	ts := make([]string, 0, len(q.held))
	for t := range q.held {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	return ts
}

// Held is what a tenant has of one tool at the scheduler, queued or released and not
// finished: the answer on events.FairHeldSubject.
type Held struct {
	Tenant   string `json:"tenant"`
	Queued   int    `json:"queued"`
	InFlight int    `json:"in_flight"`
	// Cap is the tool's concurrency key (0: none); AtCap is true when the tenant's
	// calls are held by it rather than by the others' shares.
	Cap   int  `json:"cap,omitempty"`
	AtCap bool `json:"at_cap"`
	// Calls are the claim keys (store.ClaimKey) of the tenant's queued calls in the
	// order it releases them (at most maxHeldCalls): a call's position in line.
	Calls []string `json:"calls,omitempty"`
}

// maxHeldCalls bounds Held.Calls (the answer stays one small message).
const maxHeldCalls = 256

// Position is the place in line (1 first) of the call with claim key, 0 when the
// scheduler does not hold it.
func (h Held) Position(key string) int {
	for i, k := range h.Calls {
		if k == key {
			return i + 1
		}
	}
	return 0
}

// Reason says why a tenant's calls of tool wait, in the words `toolbus call` prints.
func (h Held) Reason(tool string) string {
	if h.AtCap {
		return fmt.Sprintf("queued: tenant %s has %d calls of %s in flight, its cap (%d queued)", h.Tenant, h.InFlight, tool, h.Queued)
	}
	return fmt.Sprintf("queued: %d calls of tenant %s wait for their fair share of %s's executors (%d in flight)", h.Queued, h.Tenant, tool, h.InFlight)
}

func (q *toolQueue) heldState(p policy, tool string) []Held {
	var out []Held
	limit := p.capOf(tool)
	tenants := q.tenants()
	for t := range q.inFlight {
		if len(q.held[t]) == 0 {
			tenants = append(tenants, t)
		}
	}
	sort.Strings(tenants)
	for _, t := range tenants {
		h := Held{Tenant: t, Queued: len(q.held[t]), InFlight: q.inFlight[t], Cap: limit, AtCap: limit > 0 && q.inFlight[t] >= limit}
		for _, c := range q.held[t][:min(len(q.held[t]), maxHeldCalls)] {
			h.Calls = append(h.Calls, c.key)
		}
		out = append(out, h)
	}
	return out
}

// running is how many of the tool's released calls run (claimed, not finished).
func (q *toolQueue) running() int {
	n := -q.waiting
	for _, v := range q.inFlight {
		n += v
	}
	return n
}

// reserveFor is how long after its last call a tenant's unmet guaranteed minimum stays
// reserved by the credit window: a tenant gone longer leaves the whole capacity to the
// others (work-conserving), one between its calls finds its minimum free.
const reserveFor = 10 * time.Second

// reserve is the slots the credit window keeps free for the tenants seen lately with no
// call held: what their minimums lack of calls in flight (window.go), at most half the
// tool's capacity, so the tenants with calls always have the other half.
func (q *toolQueue) reserve(p policy, now time.Time) int {
	n := 0
	for t, at := range q.seen {
		switch {
		case now.Sub(at) > reserveFor:
			delete(q.seen, t)
		case len(q.held[t]) == 0:
			n += max(p.min(t)-q.inFlight[t], 0)
		}
	}
	return min(n, q.credit.capacity/2)
}

// heldNamed is heldState of the calls of the unknown tools' queue (q) whose tool's held
// token is tok (events.FairHeldToken), counting as in flight the released ones: tools
// whose names are no subject token share that queue, not their held views. A tenant
// is at its cap by all its calls of the queue, which the cap counts.
func (q *toolQueue) heldNamed(p policy, tok string, released map[string]*call) []Held {
	f := &toolQueue{held: map[string][]*call{}, inFlight: map[string]int{}}
	for t, cs := range q.held {
		for _, c := range cs {
			if events.FairHeldToken(c.name) == tok {
				f.held[t] = append(f.held[t], c)
			}
		}
	}
	for _, c := range released {
		if c.tool == events.UnknownToolToken && events.FairHeldToken(c.name) == tok {
			f.inFlight[c.tenant]++
		}
	}
	hs := f.heldState(p, events.UnknownToolToken)
	for i := range hs {
		hs[i].AtCap = hs[i].Cap > 0 && q.inFlight[hs[i].Tenant] >= hs[i].Cap
	}
	return hs
}
