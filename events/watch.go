package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StoredEvent is one stored event, as a reader of the stream sees it: where and when the
// stream stored it, its envelope and its data, not yet decoded into a contract type.
type StoredEvent struct {
	// Seq is the event's sequence in the stream it was read from.
	Seq     uint64
	Subject string
	// Time is when the stream stored the event.
	Time time.Time
	Meta Meta
	// Data is the event's data (JSON).
	Data json.RawMessage
	// Err is set when the message is not a decodable toolbus event (Meta and Data are
	// then empty), or when its subject and body disagree (an error wrapping
	// ErrSubjectMismatch; Meta and Data are kept, for the report): such an event counts
	// for no run.
	Err error
}

// Decode decodes the event's data into v; it fails for an event with Err set.
func (e StoredEvent) Decode(v any) error {
	if e.Err != nil {
		return e.Err
	}
	if err := json.Unmarshal(e.Data, v); err != nil {
		return fmt.Errorf("events: %s #%d: %w", e.Meta.Type, e.Seq, err)
	}
	return nil
}

// IsRunEnded reports whether the event is a run outcome (toolbus.run.<status>: not
// run.started nor run.cancel).
func (e StoredEvent) IsRunEnded() bool {
	t := e.Meta.Type
	return e.Err == nil && strings.HasPrefix(t, "toolbus.run.") && t != TypeRunStarted && t != TypeRunCancel
}

// eventOf reads one delivered message into a StoredEvent.
func eventOf(msg jetstream.Msg) (StoredEvent, *jetstream.MsgMetadata) {
	ev := StoredEvent{Subject: msg.Subject()}
	md, err := msg.Metadata()
	if err == nil {
		ev.Seq, ev.Time = md.Sequence.Stream, md.Timestamp
	} else {
		md = nil
	}
	var data json.RawMessage
	meta, err := DecodeMsg(msg, &data)
	if err != nil {
		ev.Err = err
		return ev, md
	}
	ev.Meta, ev.Data = meta, data
	ev.Err = checkStored(ev.Subject, meta, data)
	return ev, md
}

// noEventYet is what a fetch returns when no event came in time.
func noEventYet(err error) bool {
	return errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// RunEvents returns every stored event of a run, in stream order, read from the
// reader (the read mirror when there is one). It reads the events stored when it is
// called and returns without waiting: the result is one consistent prefix of the run.
// Nothing is acknowledged, nothing is executed. A run with no event gives none.
func (b *Bus) RunEvents(ctx context.Context, run string) ([]StoredEvent, error) {
	return ReadEvents(ctx, b.reader, SubjectRun(run))
}

// ReadEvents returns the events stored on a stream's subjects matching filter (FilterAll,
// SubjectRun...), in stream order, as RunEvents does.
func ReadEvents(ctx context.Context, stream jetstream.Stream, filter string) ([]StoredEvent, error) {
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("events: read %s: %w", filter, err)
	}
	// The consumer counts the matching events when it is created: read that many.
	remaining := cons.CachedInfo().NumPending
	var out []StoredEvent
	for remaining > 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		batch, err := cons.Fetch(int(min(remaining, 512)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("events: read %s: %w", filter, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			ev, md := eventOf(msg)
			if md != nil {
				remaining = md.NumPending
			}
			out = append(out, ev)
		}
		if err := batch.Error(); err != nil && !noEventYet(err) {
			return nil, fmt.Errorf("events: read %s: %w", filter, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("events: read %s: the stream stopped delivering with %d event(s) left", filter, remaining)
		}
	}
	return out, nil
}

// Watcher follows the events stored on some subjects, in stream order, as they are
// stored. It is not safe for concurrent use.
type Watcher struct {
	cons   jetstream.Consumer
	filter string
}

// Watch follows the events of filter (SubjectRun(run) for one run, FilterAll for every
// run) on the reader: from the first stored one when all is set, else from the next one
// stored. The events a run stores after Watch returns are all delivered, so a caller
// that starts a run should watch it first.
func (b *Bus) Watch(ctx context.Context, filter string, all bool) (*Watcher, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !all {
		// An ordered consumer is created on its first fetch: DeliverNew would start
		// there, not here. Start after the last event stored now instead.
		info, err := b.reader.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("events: watch %s: %w", filter, err)
		}
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, info.State.LastSeq+1
	}
	cons, err := b.reader.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("events: watch %s: %w", filter, err)
	}
	return &Watcher{cons: cons, filter: filter}, nil
}

// Next returns the next event, waiting at most wait for it; ok is false when none came
// in that time. It returns ctx's error once ctx is done.
func (w *Watcher) Next(ctx context.Context, wait time.Duration) (ev StoredEvent, ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return StoredEvent{}, false, err
	}
	msg, err := w.cons.Next(jetstream.FetchMaxWait(wait))
	if err != nil {
		if ctx.Err() != nil {
			return StoredEvent{}, false, ctx.Err()
		}
		if noEventYet(err) {
			return StoredEvent{}, false, nil
		}
		return StoredEvent{}, false, fmt.Errorf("events: watch %s: %w", w.filter, err)
	}
	ev, _ = eventOf(msg)
	return ev, true, nil
}
