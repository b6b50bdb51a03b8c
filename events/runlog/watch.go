package runlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
)

// StoredEvent is one stored event, as a reader of the stream sees it: where and when the
// stream stored it, its envelope and its data, not yet decoded into a contract type.
type StoredEvent struct {
	// Seq is the event's sequence in the stream it was read from.
	Seq     uint64
	Subject string
	// Time is when the stream stored the event.
	Time time.Time
	Meta events.Meta
	// Data is the event's data (JSON).
	Data json.RawMessage
	// Err is set when the message is not a decodable toolbus event (Meta and Data are
	// then empty), or when its subject and body disagree (an error wrapping
	// events.ErrSubjectMismatch; Meta and Data are kept, for the report): such an event counts
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
	return e.Err == nil && events.IsRunEndedType(e.Meta.Type)
}

// StoredOf reads one stored message into a StoredEvent.
func StoredOf(raw *jetstream.RawStreamMsg) StoredEvent {
	ev := StoredEvent{Seq: raw.Sequence, Subject: raw.Subject, Time: raw.Time}
	var data json.RawMessage
	meta, err := events.Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, &data)
	if err != nil {
		ev.Err = err
		return ev
	}
	ev.Meta, ev.Data = meta, data
	ev.Err = events.CheckStored(ev.Subject, meta, data)
	return ev
}

// Events returns every stored event of a run, in stream order. It reads the events
// stored when it is called and returns without waiting: the result is one consistent
// prefix of the run. Nothing is acknowledged, nothing is executed. A run with no event
// gives none.
//
// Readers create no consumer: they read with direct gets (the next message on the
// filter from a sequence), which every role may send and which cost the server nothing
// that outlives the request. A consumer per reader would count toward the stream's
// consumer limit, which a reader could then fill for everyone.
func Events(ctx context.Context, b *events.Bus, run string) ([]StoredEvent, error) {
	return Read(ctx, b.EventStream(), events.SubjectRun(run))
}

// Read returns the events stored on a stream's subjects matching filter (FilterAll,
// SubjectRun...), in stream order, up to the last one stored when it is called, as
// Events does.
func Read(ctx context.Context, stream jetstream.Stream, filter string) ([]StoredEvent, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("events: read %s: %w", filter, err)
	}
	last := info.State.LastSeq
	var out []StoredEvent
	for seq := uint64(1); seq <= last; {
		raw, err := events.GetMsg(ctx, stream, seq, filter)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("events: read %s: %w", filter, err)
		}
		if raw.Sequence > last {
			break
		}
		out = append(out, StoredOf(raw))
		seq = raw.Sequence + 1
	}
	return out, nil
}

// Watcher follows the events stored on some subjects, in stream order, as they are
// stored. It is not safe for concurrent use.
type Watcher struct {
	stream jetstream.Stream
	filter string
	next   uint64 // the sequence to read from
}

// Watch follows the events of filter (SubjectRun(run) for one run, FilterAll for every
// run): from the first stored one when all is set, else from the next one stored. The
// events a run stores after Watch returns are all delivered, so a caller that starts a
// run should watch it first. Like Events it creates no consumer: it reads with direct
// gets and polls for new events.
func Watch(ctx context.Context, b *events.Bus, filter string, all bool) (*Watcher, error) {
	if err := b.CheckWatch(filter); err != nil {
		return nil, err
	}
	w := &Watcher{stream: b.EventStream(), filter: filter, next: 1}
	if !all {
		info, err := w.stream.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("events: watch %s: %w", filter, err)
		}
		w.next = info.State.LastSeq + 1
	}
	return w, nil
}

// watchPoll bounds how long a watcher waits between two looks for a new event.
const watchPoll = 100 * time.Millisecond

// Next returns the next event, waiting at most wait for it; ok is false when none came
// in that time. It returns ctx's error once ctx is done.
func (w *Watcher) Next(ctx context.Context, wait time.Duration) (ev StoredEvent, ok bool, err error) {
	deadline := time.Now().Add(wait)
	pause := 5 * time.Millisecond
	for {
		if err := ctx.Err(); err != nil {
			return StoredEvent{}, false, err
		}
		raw, err := events.GetMsg(ctx, w.stream, w.next, w.filter)
		switch {
		case err == nil:
			w.next = raw.Sequence + 1
			return StoredOf(raw), true, nil
		case ctx.Err() != nil:
			return StoredEvent{}, false, ctx.Err()
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return StoredEvent{}, false, fmt.Errorf("events: watch %s: %w", w.filter, err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return StoredEvent{}, false, nil
		}
		select {
		case <-ctx.Done():
			return StoredEvent{}, false, ctx.Err()
		case <-time.After(min(pause, left)):
		}
		pause = min(pause*2, watchPoll)
	}
}
