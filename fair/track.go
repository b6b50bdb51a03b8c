package fair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// claimsPrefix is the subject prefix of the claims bucket's keys.
const claimsPrefix = "$KV." + store.BucketClaims + "."

// listen hears, on core NATS (no message of its own per call), the executors' claims
// (a released call started), the results (it finished) and the requests for what is
// held. A claim deleted is a call that did not run (it waits for approval): finished too.
func (s *Scheduler) listen() ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	for subj, h := range map[string]nats.MsgHandler{
		claimsPrefix + ">":                          s.claimed,
		events.SubjectPrefix + ".*.tool.finished.*": s.finishedEvent,
		events.FairHeldPrefix + ".*":                s.answerHeld,
		events.FairHeldPrefix + ".*.*":              s.answerHeld,
	} {
		sub, err := s.nc.Subscribe(subj, h)
		if err != nil {
			return subs, fmt.Errorf("fair: subscribe %s: %w", subj, err)
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

func (s *Scheduler) claimed(m *nats.Msg) {
	key := strings.TrimPrefix(m.Subject, claimsPrefix)
	op := m.Header.Get("KV-Operation")
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls[key]
	if c == nil {
		return
	}
	if op == "DEL" || op == "PURGE" {
		s.finish(c)
		return
	}
	if !c.started {
		c.started, c.claimed = true, time.Now()
		q := s.toolQueue(c.tool)
		q.waiting--
		q.pace.claimed(c.claimed, c.released)
		s.signal()
	}
}

func (s *Scheduler) finishedEvent(m *nats.Msg) {
	// Only the call's position: the result itself is the injector's to read.
	key, ok := finishedKey(m)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.calls[key]; c != nil {
		s.finish(c)
	}
}

// finish frees a released call's place. Called with s.mu held.
func (s *Scheduler) finish(c *call) {
	delete(s.calls, c.key)
	q := s.toolQueue(c.tool)
	q.inFlight[c.tenant]--
	if q.inFlight[c.tenant] <= 0 {
		delete(q.inFlight, c.tenant)
	}
	if !c.started {
		q.waiting--
	} else if !c.claimed.IsZero() {
		q.credit.ran(time.Since(c.claimed))
	}
	s.signal()
}

// signal asks Run's loop to release what may go now (outside the handler that learnt it).
func (s *Scheduler) signal() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// reconcile corrects, for each tool that holds calls, what a claim or result unheard
// left counted: an executors' queue with nothing pending waits for nothing, and one with
// nothing pending or running runs nothing.
func (s *Scheduler) reconcile(ctx context.Context) {
	s.mu.Lock()
	var tools []string
	busy := false // an idle scheduler reads no instance records
	for tool, q := range s.tools {
		busy = busy || len(q.held) > 0 || len(q.inFlight) > 0
		if len(q.held) > 0 && (q.waiting > 0 || len(q.inFlight) > 0) {
			tools = append(tools, tool)
		}
	}
	s.mu.Unlock()
	if busy {
		s.capacities(ctx)
	}
	for _, tool := range tools {
		cons, err := s.queue.Consumer(ctx, events.ToolConsumer(tool))
		if err != nil {
			continue
		}
		ci, err := cons.Info(ctx)
		if err != nil || ci.NumPending > 0 {
			continue
		}
		s.mu.Lock()
		for _, c := range s.calls {
			if c.tool != tool {
				continue
			}
			if ci.NumAckPending == 0 {
				s.finish(c)
			} else if !c.started {
				c.started = true
				s.toolQueue(tool).waiting--
			}
		}
		s.mu.Unlock()
	}
	s.dispatchAll()
}

// answerHeld answers toolbus_fair.held.<tool> (events.FairHeldToken) with the tool's
// Held per tenant, and toolbus_fair.held.<tool>.<identity> with that identity's only:
// who asks is the subject's identity, which the asker's credentials bind
// (events.FairHeldForSubject).
func (s *Scheduler) answerHeld(m *nats.Msg) {
	toks := strings.Split(strings.TrimPrefix(m.Subject, events.FairHeldPrefix+"."), ".")
	tool := toks[0]
	s.mu.Lock()
	var held []Held
	if q := s.tools[tool]; q != nil && toolbus.ValidToolName(tool) {
		held = q.heldState(s.pol, tool)
	} else if q := s.tools[events.UnknownToolToken]; q != nil && !toolbus.ValidToolName(tool) {
		held = q.heldNamed(s.pol, tool, s.calls)
	}
	s.mu.Unlock()
	if len(toks) == 2 {
		held = slices.DeleteFunc(held, func(h Held) bool { return events.IdentityToken(h.Tenant) != toks[1] })
	}
	b, _ := json.Marshal(held) // plain data
	_ = m.Respond(b)
}

// recoverReleases finds where an earlier scheduler stopped: the low-water mark of the
// last release (0: none) and the staged sequences released above it.
func (s *Scheduler) recoverReleases(ctx context.Context) (uint64, map[uint64]bool, error) {
	done := map[uint64]bool{}
	last, err := s.queue.GetLastMsgForSubject(ctx, events.QueuePrefix+".>")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, done, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("fair: last release: %w", err)
	}
	low, _ := strconv.ParseUint(last.Header.Get(events.FairLowHeader), 10, 64)
	from := low + 1
	if low == 0 {
		// No release has a mark (fair share just turned on): the releases start after
		// the first staged call.
		first, err := s.queue.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(events.StagePrefix+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, done, nil
		}
		if err != nil {
			return 0, nil, fmt.Errorf("fair: first staged call: %w", err)
		}
		from = first.Sequence
	}
	err = s.each(ctx, from, last.Sequence, events.QueuePrefix+".>", func(m *jetstream.RawStreamMsg) {
		if seq, err := strconv.ParseUint(m.Header.Get(events.FairStagedHeader), 10, 64); err == nil {
			done[seq] = true
		}
	})
	return low, done, err
}

// each reads the messages on filter from sequence from to to, one get each (at a
// restart only: what was staged or released since the low-water mark).
func (s *Scheduler) each(ctx context.Context, from, to uint64, filter string, f func(*jetstream.RawStreamMsg)) error {
	for seq := from; seq <= to; {
		m, err := s.queue.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("fair: read %s from %d: %w", filter, seq, err)
		}
		if m.Sequence > to {
			return nil
		}
		f(m)
		seq = m.Sequence + 1
	}
	return nil
}

// capacities sets, for the credit window, each tool's capacity: the slots of the live
// executors that serve it, from their instance records (an executor serving several
// tools counts its slots for each: then the window releases more, never fewer).
func (s *Scheduler) capacities(ctx context.Context) {
	if s.pol.window != windowCredit {
		return
	}
	ins, err := s.store.Instances(ctx)
	if err != nil {
		return // the last capacities hold
	}
	caps := map[string]int{}
	for _, in := range ins {
		for _, t := range in.Tools {
			caps[events.ToolToken(t)] += in.Concurrency
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.caps = caps
	for tool, q := range s.tools {
		q.credit.capacity = caps[tool]
	}
}
