package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	toolbus "github.com/toolbus/toolbus"
)

// Publishing that no other party can suppress.
//
// Every event has a deterministic id, sent as Nats-Msg-Id, so an event published again
// after a crash is stored once: the stream's duplicate window drops the copy. But that
// window is keyed by the id across the whole stream, whatever the subject, and a
// subject permission cannot restrict headers: any publisher may send a message carrying
// the id of an event another role will publish (`<run>/0/<call>/tool.finished` on
// toolbus.<decoy>.run.started), and the real event would then be acknowledged as a
// "duplicate" and never stored.
//
// So a duplicate acknowledgement is not trusted: it names the sequence of the message
// stored under the id, and the publisher reads that message. It is this very event
// (same subject, type and id, with data that agrees with the subject: a re-publish, or
// the same event from another worker) only when all of these match; only a publisher
// allowed on the event's own subject can store such a message, and then only an event
// of that very run. Anything else is a squat, and the event is published again
// under a message id nobody can predict (<id>/guarded/<random>), guarded per subject
// instead: the publisher looks for the event
// among the messages of its subject (crash-safe re-publishing still stores it once)
// and publishes with Nats-Expected-Last-Subject-Sequence set to the last one it saw,
// so two publishers of the same event (a redelivery racing another worker) cannot both
// store it. Only a publisher on the same subject can make that guard fail, and then the
// look-up simply continues from where it stopped.
//
// The common path costs nothing: a publish that is not a duplicate is stored and
// acknowledged as before. A true duplicate costs one direct get; a squatted event a
// walk over its subject (a handful of messages of one run) and one more publish.

// GuardedIDSeparator separates the event id from the random suffix of the Nats-Msg-Id of
// an event published under the per-subject guard: <id>/guarded/<random>.
const GuardedIDSeparator = "/guarded/"

// headerExpectedLastSubjSeq is the JetStream header of optimistic concurrency per subject.
const headerExpectedLastSubjSeq = "Nats-Expected-Last-Subject-Sequence"

// maxGuardedAttempts bounds the guarded publishes of one event that lose against other
// messages stored on its subject meanwhile.
const maxGuardedAttempts = 100

// guardHook, when set (tests), runs between the look-up of a guarded publish and the
// publish itself: where two publishers of the same event race.
var guardHook func()

// squats counts the events of this process whose id was found squatted (tests and
// operators read it through SquatsSeen).
var squats atomic.Uint64

// SquatsSeen returns how many events this process found with their id taken by a
// message that is not them (each was then stored under the per-subject guard).
func SquatsSeen() uint64 { return squats.Load() }

// ErrSquatted is wrapped by the error of a publish whose event could not be stored
// under the per-subject guard after its id was found squatted (the subject kept
// changing under it).
var ErrSquatted = errors.New("events: event id squatted")

// publishMsg publishes an encoded event (its Nats-Msg-Id header set to id) and waits
// for the stream's acknowledgement. A duplicate acknowledgement is checked against
// what the stream holds (settleDuplicate).
func (b *Bus) publishMsg(ctx context.Context, msg *nats.Msg, id string) (*jetstream.PubAck, error) {
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(b.msgID(id)))
	if err != nil {
		return nil, fmt.Errorf("events: publish %s: %w", id, b.notBound(msg.Subject, err))
	}
	if !ack.Duplicate || b.team {
		// In a team account only the core and this team may publish on the subjects of
		// its tools: a duplicate is this event (and the team may not read the stream).
		return ack, nil
	}
	return b.settleDuplicate(ctx, msg, ack)
}

// settleDuplicate decides what a duplicate acknowledgement of msg means. When the
// message stored under its id is this event (same subject, type and id), it is a true
// duplicate and ack stands. Otherwise the id was squatted: msg is published under the
// per-subject guard.
func (b *Bus) settleDuplicate(ctx context.Context, msg *nats.Msg, ack *jetstream.PubAck) (*jetstream.PubAck, error) {
	want, err := DecodeEvent(msg)
	if err != nil {
		return nil, err
	}
	attempt := attemptOf(want)
	raw, err := b.storedAt(ctx, ack.Sequence, msg.Subject)
	switch {
	case err == nil && sameEvent(raw, msg.Subject, want.Meta, attempt):
		return ack, nil
	case err == nil && sameEvent(raw, msg.Subject, want.Meta, 0):
		// The result of another attempt at the call: one cut off from the bus whose
		// publication arrived late. This attempt's result is stored beside it (the
		// injector joins the one of the attempt that owns the call).
		slog.Default().Info("result of another attempt stored under the id: storing this attempt's beside it",
			"id", want.ID, "attempt", attempt, "stored_seq", ack.Sequence)
		return b.publishGuarded(ctx, msg, want.Meta, attempt)
	case err != nil && !errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, fmt.Errorf("events: publish %s: read the message stored under its id: %w", want.ID, err)
	}
	squats.Add(1)
	holder := "a message no longer stored"
	if raw != nil {
		holder = raw.Subject
	}
	slog.Default().Warn("event id squatted: publishing under the per-subject guard",
		"id", want.ID, "subject", msg.Subject, "squatted_by_seq", ack.Sequence, "squatter_subject", holder)
	return b.publishGuarded(ctx, msg, want.Meta, attempt)
}

// sameEvent reports whether a stored message is the event: the same subject, type and
// id, and data that agrees with that subject (CheckSubject). A message on the event's
// own subject whose data names another run is no event of this run: consumers
// terminate it, so it must not stand in for the real one either. For a tool.finished
// of an executor attempt (attempt > 0), a result of another attempt is not it either:
// a late result of an attempt that was cut off must not stand in for the result of the
// attempt that took the call over (the injector joins the latter); attempt 0 matches a
// result of any attempt.
func sameEvent(raw *jetstream.RawStreamMsg, subject string, m Meta, attempt int) bool {
	if raw == nil || raw.Subject != subject {
		return false
	}
	got, err := DecodeEvent(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil || got.ID != m.ID || got.Type != m.Type {
		return false
	}
	v := DataOf(got.Type)
	if v == nil {
		return true
	}
	if got.Bind(v) != nil || CheckSubject(raw.Subject, got.Meta, v) != nil {
		return false
	}
	if tf, ok := v.(*toolbus.ToolFinished); ok && attempt > 0 && tf.Attempt > 0 && tf.Attempt != attempt {
		return false
	}
	return true
}

// attemptOf returns the attempt of a tool.finished event (0 for any other event, or a
// result no executor attempt produced).
func attemptOf(e Event) int {
	if e.Type != TypeToolFinished {
		return 0
	}
	var tf toolbus.ToolFinished
	if e.Bind(&tf) != nil {
		return 0
	}
	return tf.Attempt
}

// publishGuarded stores msg on its subject unless the subject already holds the event,
// under a random message id: the guard is the subject's last sequence.
func (b *Bus) publishGuarded(ctx context.Context, msg *nats.Msg, m Meta, attempt int) (*jetstream.PubAck, error) {
	guarded := nats.NewMsg(msg.Subject)
	for k, v := range msg.Header {
		guarded.Header[k] = v
	}
	// A message id nobody can know before it is stored (so nobody can squat it), which
	// the contract still finds in the header; the guard, not the id, keeps it unique.
	guarded.Header.Set(HeaderMsgID, m.ID+GuardedIDSeparator+nuid.Next())
	// The guard is the event's own subject, whatever condition msg was published with.
	guarded.Header.Del(headerExpectedLastSubjSeqSubj)
	guarded.Data = msg.Data
	var last uint64
	for try := 0; try < maxGuardedAttempts; try++ {
		seq, found, err := b.findOnSubject(ctx, msg.Subject, m, attempt, last+1)
		if err != nil {
			return nil, err
		}
		if found {
			return &jetstream.PubAck{Stream: b.stream.CachedInfo().Config.Name, Sequence: seq, Duplicate: true}, nil
		}
		last = seq
		if guardHook != nil {
			guardHook()
		}
		guarded.Header.Set(headerExpectedLastSubjSeq, strconv.FormatUint(last, 10))
		ack, err := b.js.PublishMsg(ctx, guarded)
		if err == nil {
			return ack, nil
		}
		if !wrongLastSequence(err) {
			return nil, fmt.Errorf("events: publish %s: %w", m.ID, writeRefusal(err))
		}
		// Something was stored on the subject since: look at it (it may be this event,
		// published by another worker).
	}
	return nil, fmt.Errorf("%w: %s: the subject %s kept changing", ErrSquatted, m.ID, msg.Subject)
}

// findOnSubject walks the messages of subject from sequence from on: it returns the
// sequence of the event when one of them is it, else the sequence of the last message
// (from-1 when there is none from there on).
func (b *Bus) findOnSubject(ctx context.Context, subject string, m Meta, attempt int, from uint64) (seq uint64, found bool, err error) {
	last := from - 1
	for {
		raw, err := getMsg(ctx, b.stream, last+1, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return last, false, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("events: look up %s on %s: %w", m.ID, subject, err)
		}
		if sameEvent(raw, subject, m, attempt) {
			return raw.Sequence, true, nil
		}
		last = raw.Sequence
	}
}

// Stored reports whether the stream holds the event e (its subject, type and id), and
// its sequence: a direct-get walk over the messages of its subject, which any role
// with read access may make.
//
// In a team account only the last message of the subject can be read (the core exports
// the direct get in its subject form, for its tools' result subjects): Stored then
// reports whether that one is e. An executor there also records in the call's claim
// that its result was stored (store.Claim.Done).
func (b *Bus) Stored(ctx context.Context, e Envelope) (uint64, bool, error) {
	if b.team {
		raw, err := b.stream.GetLastMsgForSubject(ctx, e.Subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, nats.ErrNoResponders) {
			// No responders: the stream serves no direct gets (a read mirror, or
			// replicas): the claim's done mark is all there is to go by.
			return 0, false, nil
		}
		if err != nil {
			return 0, false, err
		}
		if sameEvent(raw, e.Subject, e.Meta, 0) {
			return raw.Sequence, true, nil
		}
		return 0, false, nil
	}
	seq, found, err := b.findOnSubject(ctx, e.Subject, e.Meta, 0, 1)
	if !found {
		seq = 0
	}
	return seq, found, err
}

// wrongLastSequence reports a failed Nats-Expected-Last-Subject-Sequence (10071, or
// 10164 on a replicated stream).
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// PubFuture is the pending acknowledgement of an event published with
// PublishEventAsync. Await it with AwaitAcks, which checks a duplicate acknowledgement
// as a synchronous publish does.
type PubFuture struct {
	bus *Bus
	f   jetstream.PubAckFuture
	id  string
}

// Wait waits for the acknowledgement: the event is stored (or was already).
func (p *PubFuture) Wait(ctx context.Context) (*jetstream.PubAck, error) {
	select {
	case ack := <-p.f.Ok():
		if !ack.Duplicate || p.bus.team {
			return ack, nil
		}
		return p.bus.settleDuplicate(ctx, p.f.Msg(), ack)
	case err := <-p.f.Err():
		return nil, fmt.Errorf("events: publish %s: %w", p.id, writeRefusal(err))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// AwaitAcks waits for every publish future; it returns the first failure.
func AwaitAcks(ctx context.Context, futures []*PubFuture) error {
	var first error
	for _, f := range futures {
		if _, err := f.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if first == nil {
				first = err
			}
		}
	}
	return first
}
