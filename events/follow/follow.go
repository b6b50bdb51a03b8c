package follow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Follower follows one run's events live through the core's read service, in a client
// account (Run): the service pushes each event as it is stored, in stream order,
// and the Follower follows again from the next sequence when a follow ends before the
// run does (events.FollowMax) or goes quiet. It is not safe for concurrent use.
type Follower struct {
	nc    *nats.Conn
	id    string
	run   string
	next  uint64
	sub   *nats.Subscription
	heard time.Time
	// lastEnded: the last event returned was the run's outcome; ended: the follow
	// ended after it.
	lastEnded, ended bool
}

// Run follows the events of run that its identity may see live, from sequence from
// (1: the run's first event; 0: the next one stored), through the core's read service
// (FollowSubject). Only a client account's bus follows (a core account's watches:
// Watch). ErrNotFound when the run does not exist or the identity may not see it (the
// service answers both alike), ErrNotBound when nothing answers the identity's follows.
func Run(ctx context.Context, b *events.Bus, run string, from uint64) (*Follower, error) {
	if !b.ClientAccount() {
		return nil, errors.New("events: Follow is a client account's (TOOLBUS_NATS_READ_PREFIX): a core account's bus watches the stream (Watch)")
	}
	f := &Follower{nc: b.Conn(), id: b.ReadIdentity(), run: run, next: from}
	if err := f.request(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// request asks the read service for a follow from f.next and reads its first answer.
func (f *Follower) request(ctx context.Context) error {
	if f.sub != nil {
		_ = f.sub.Unsubscribe()
	}
	sub, err := f.nc.SubscribeSync(f.nc.NewRespInbox())
	if err != nil {
		return fmt.Errorf("events: follow %s: %w", f.run, err)
	}
	f.sub = sub
	body, _ := json.Marshal(events.FollowRequest{From: f.next})
	subject := events.FollowSubject(f.id, f.run)
	if err := f.nc.PublishRequest(subject, sub.Subject, body); err != nil {
		return fmt.Errorf("events: follow %s: %w", f.run, err)
	}
	m, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return fmt.Errorf("events: follow %s: %w", f.run, err)
	}
	f.heard = time.Now()
	switch st, desc := m.Header.Get("Status"), m.Header.Get("Description"); {
	case st == events.FollowIdle:
		return nil
	case st == "503" && !strings.HasPrefix(desc, "toolbus"): // the server's "no responders"
		return fmt.Errorf("%w %s: nothing answers %s (is the core's read service running, and is this account bound to %s?)", events.ErrNotBound, f.id, subject, f.id)
	case st == "404":
		return fmt.Errorf("%w: run %s (or %s may not see it)", events.ErrNotFound, f.run, f.id)
	default:
		return fmt.Errorf("events: follow %s: %s %s", f.run, st, m.Header.Get("Description"))
	}
}

// followLost is how long a Follower waits without hearing its follow (events or
// heartbeats) before it follows again.
const followLost = 3 * events.FollowIdleEvery

// Next returns the next event of the run, waiting at most wait for it; ok is false when
// none came in that time. After the run's outcome it returns io.EOF.
func (f *Follower) Next(ctx context.Context, wait time.Duration) (ev runlog.StoredEvent, ok bool, err error) {
	deadline := time.Now().Add(wait)
	for {
		if f.ended {
			return runlog.StoredEvent{}, false, io.EOF
		}
		if time.Since(f.heard) > followLost {
			if f.lastEnded { // nothing comes after the outcome
				f.ended = true
				continue
			}
			if err := f.request(ctx); err != nil {
				return runlog.StoredEvent{}, false, err
			}
		}
		left := min(time.Until(deadline), followLost-time.Since(f.heard))
		if left <= 0 {
			if time.Until(deadline) <= 0 {
				return runlog.StoredEvent{}, false, nil
			}
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, left)
		m, err := f.sub.NextMsgWithContext(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return runlog.StoredEvent{}, false, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			continue
		case err != nil:
			return runlog.StoredEvent{}, false, fmt.Errorf("events: follow %s: %w", f.run, err)
		}
		f.heard = time.Now()
		switch st := m.Header.Get("Status"); st {
		case "":
		case events.FollowIdle:
			continue
		case events.FollowEnd:
			if f.lastEnded {
				f.ended = true
				continue
			}
			// The follow lasted its most: follow again from the next sequence.
			if err := f.request(ctx); err != nil {
				return runlog.StoredEvent{}, false, err
			}
			continue
		default:
			return runlog.StoredEvent{}, false, fmt.Errorf("events: follow %s: %s %s", f.run, st, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return runlog.StoredEvent{}, false, fmt.Errorf("events: follow %s: an event without its sequence: %w", f.run, err)
		}
		if seq < f.next {
			continue // sent again by a follow from an earlier sequence
		}
		ts, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
		h := nats.Header{}
		for k, v := range m.Header {
			h[k] = v
		}
		subject := h.Get(jetstream.SubjectHeader)
		for _, k := range []string{jetstream.StreamHeader, jetstream.SubjectHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer} {
			h.Del(k)
		}
		f.next = seq + 1
		ev := runlog.StoredOf(&jetstream.RawStreamMsg{Subject: subject, Sequence: seq, Header: h, Data: m.Data, Time: ts})
		f.lastEnded = events.IsFinalOutcome(subject)
		return ev, true, nil
	}
}

// Close ends the follow (the service ends it at the latest after FollowMax).
func (f *Follower) Close() error {
	if f.sub == nil {
		return nil
	}
	return f.sub.Unsubscribe()
}
