// Package fair is the fair scheduler of the tools' queues (docs/fair-share.md): with
// fair share set up (events.Config.FairShare) the server stages every call on
// toolbus_stage.<tool>, and the scheduler, in the injector's process, releases them onto
// the tool's queue subject, which the executors pull as before: at most about what the
// tool's executors can take at once, picking the next call by weighted round robin over
// the tenants (the run's principal, as the core's planner wrote it in the call), with a
// guaranteed minimum and a cap of calls in flight per tenant and tool.
package fair

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// reconcileEvery is how often a tool that holds calls checks its executors' queue, in
// case a claim or result went unheard (they are heard on core NATS, best effort).
const reconcileEvery = 2 * time.Second

// Scheduler releases staged calls fairly. One per deployment is the intended setup;
// two release each call once anyway (the queue stream deduplicates by the staged
// sequence, and the executors' claims run a call once), each with its own view of the
// shares.
type Scheduler struct {
	js    jetstream.JetStream
	nc    *nats.Conn
	store *store.Store
	queue jetstream.Stream
	pol   policy
	log   *slog.Logger

	mu       sync.Mutex
	tools    map[string]*toolQueue
	calls    map[string]*call // claim key -> released call, not finished
	order    []uint64         // staged sequences not yet released and stored, in order
	stored   map[uint64]bool  // released and stored, above the low-water mark
	rtt      rtt              // a release's round trip (window.go)
	caps     map[string]int   // tool -> its executors' slots (credit window)
	lastSeen uint64           // the last staged sequence read
	// replaying holds the calls read again at a restart until all are read.
	replaying bool
	kick      chan struct{}
	// pending are the releases awaiting the server's acknowledgement; acks are the
	// acknowledgements heard (release.go), taken in under mu by drainAcks.
	pending map[uint64]*call
	ackMu   sync.Mutex
	acks    []releaseAck
}

// Staging reports whether the queue stream of bus stages calls (fair share set up).
func Staging(ctx context.Context, bus *events.Bus) (bool, error) {
	s, err := bus.JetStream().Stream(ctx, events.QueueStreamName(bus.Config().Stream))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("fair: queue stream: %w", err)
	}
	src := s.CachedInfo().Config.Sources
	return len(src) == 1 && len(src[0].SubjectTransforms) == 1 && src[0].SubjectTransforms[0].Destination == events.StageDestination, nil
}

// New returns a scheduler for bus's queue stream.
func New(ctx context.Context, bus *events.Bus, cfg Shares, log *slog.Logger) (*Scheduler, error) {
	pol, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	s, err := bus.JetStream().Stream(ctx, events.QueueStreamName(bus.Config().Stream))
	if err != nil {
		return nil, fmt.Errorf("fair: queue stream: %w", err)
	}
	sc := &Scheduler{nc: bus.Conn(), store: bus.Store(), queue: s, pol: pol, log: log.With("role", "fair"),
		tools: map[string]*toolQueue{}, calls: map[string]*call{}, stored: map[uint64]bool{}, kick: make(chan struct{}, 1), pending: map[uint64]*call{}}
	if sc.js, err = sc.releaser(); err != nil {
		return nil, err
	}
	return sc, nil
}

// Run schedules until ctx ends. It first finds where a scheduler before it stopped:
// the low-water mark of the last release, the releases above it, and the staged calls
// the durable delivered to the one before (read again with direct gets).
func (s *Scheduler) Run(ctx context.Context) error {
	cons, err := s.queue.Consumer(ctx, events.FairConsumer)
	if err != nil {
		return fmt.Errorf("fair: the scheduler's consumer %s (toolbus init creates it with TOOLBUS_FAIR_SHARE): %w", events.FairConsumer, err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("fair: consumer %s: %w", events.FairConsumer, err)
	}
	low, done, err := s.recoverReleases(ctx)
	if err != nil {
		return err
	}
	subs, err := s.listen()
	defer func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	if err != nil {
		return err
	}
	s.capacities(ctx)
	s.mu.Lock()
	s.lastSeen, s.replaying = low, true
	s.mu.Unlock()
	if err := s.replay(ctx, low+1, ci.Delivered.Stream, done); err != nil {
		return err
	}
	// Every tenant's held calls are known now: release in fair order, not in the order
	// the replay read them.
	s.mu.Lock()
	s.replaying = false
	s.mu.Unlock()
	s.dispatchAll()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if md, err := m.Metadata(); err == nil {
			s.staged(md.Sequence.Stream, m.Subject(), m.Headers(), m.Data(), done)
		}
	})
	if err != nil {
		return fmt.Errorf("fair: read staged calls: %w", err)
	}
	defer cc.Stop()
	s.log.Info("fair scheduler started", "from", low+1, "released_above", len(done))
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.reconcile(ctx)
		case <-s.kick:
			s.dispatchAll()
		}
	}
}

// replay reads the staged calls from from to to (those the durable delivered to an
// earlier scheduler) with direct gets.
func (s *Scheduler) replay(ctx context.Context, from, to uint64, done map[uint64]bool) error {
	return s.each(ctx, from, to, events.StagePrefix+".>", func(m *jetstream.RawStreamMsg) {
		s.staged(m.Sequence, m.Subject, m.Header, m.Data, done)
	})
}

// staged takes one staged call: decodes its tenant and holds it, unless an earlier
// scheduler released it (done).
func (s *Scheduler) staged(seq uint64, subject string, hdr nats.Header, data []byte, done map[uint64]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq <= s.lastSeen {
		return // read already
	}
	s.lastSeen = seq
	if done[seq] {
		delete(done, seq)
		return
	}
	c := &call{seq: seq, tool: strings.TrimPrefix(subject, events.StagePrefix+"."), hdr: hdr, data: data, tenant: "_unknown"}
	if req, err := decodeStaged(subject, hdr, data); err == nil {
		if req.Principal.ID != "" {
			c.tenant = req.Principal.ID
		}
		c.key, c.name = store.ClaimKey(c.tool, req.RunID, req.Step, req.Call.CallID), req.Call.Tool
	} else {
		c.key = "_seq." + strconv.FormatUint(seq, 10) // no claim names it: reconcile frees it
		s.log.Warn("staged call not decoded: released as tenant _unknown", "seq", seq, "error", err)
	}
	s.order = append(s.order, seq)
	q := s.toolQueue(c.tool)
	q.hold(c)
	if !s.replaying {
		s.dispatch(c.tool, q)
	}
}

func (s *Scheduler) toolQueue(tool string) *toolQueue {
	q := s.tools[tool]
	if q == nil {
		q = newToolQueue()
		q.credit.capacity = s.caps[tool]
		s.tools[tool] = q
	}
	return q
}

// dispatch releases the tool's next calls while fewer than the lookahead wait for an
// executor, and, with the pace or credit window, the call of the tenant whose turn it is
// even when they do if it has none in flight (pick's idleOnly). Called with s.mu held.
func (s *Scheduler) dispatch(tool string, q *toolQueue) {
	for {
		full := q.waiting >= s.lookahead(q)
		if full && s.pol.window == windowRunning {
			return
		}
		var was map[string]bool // only a capped tool logs a tenant reaching its cap
		if s.pol.capOf(tool) > 0 {
			was = maps.Clone(q.capped)
		}
		c := q.pick(s.pol, tool, full)
		for t, v := range q.capped {
			if v && !was[t] {
				s.log.Info("tenant at its cap: its calls are queued", "tool", tool, "tenant", t, "in_flight", q.inFlight[t], "cap", s.pol.capOf(tool))
			}
		}
		if c == nil {
			return
		}
		s.calls[c.key] = c
		s.release(c)
	}
}

// maxLookahead bounds the released calls of a tool that wait for an executor.
const maxLookahead = 32

// lookahead is how many released calls of the tool may wait for an executor: the
// configured minimum, or as many as its executors run (one round of their slots), which
// keeps busy executors fed between a claim and the next release; with the pace window
// (window.go) no more than one release cycle's calls at the rate they start.
func (s *Scheduler) lookahead(q *toolQueue) int {
	running := -q.waiting
	for _, n := range q.inFlight {
		running += n
	}
	if s.pol.window != windowRunning {
		if s.pol.window == windowCredit {
			if n, ok := creditWindow(q.credit, running, q.reserve(s.pol, time.Now())); ok {
				return n
			}
		}
		running = min(running, paceWindow(q.pace.rate(time.Now()), q.pace.cycle, s.rtt.seconds))
	}
	return max(s.pol.lookahead, min(running, maxLookahead))
}

func (s *Scheduler) dispatchAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainAcks()
	for tool, q := range s.tools {
		s.dispatch(tool, q)
	}
}

// failed puts a call whose release was not stored back at the front of its tenant's
// queue; the next reconcile releases it again.
func (s *Scheduler) failed(c *call, err error) {
	s.log.Warn("release not stored: held again", "tool", c.tool, "seq", c.seq, "error", err)
	q := s.toolQueue(c.tool)
	q.inFlight[c.tenant]--
	if !c.started {
		q.waiting--
	}
	delete(s.calls, c.key)
	q.unhold(c)
}

// low is the low-water mark: every staged call at or below it is released and stored.
func (s *Scheduler) low() uint64 {
	if len(s.order) > 0 {
		return s.order[0] - 1
	}
	return s.lastSeen
}

// advance drops the stored releases from the front of the order.
func (s *Scheduler) advance() {
	for len(s.order) > 0 && s.stored[s.order[0]] {
		delete(s.stored, s.order[0])
		s.order = s.order[1:]
	}
}
