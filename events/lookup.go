package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/store"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FirstEvent returns the first event stored on filter (a subject, wildcards allowed),
// read with one direct get like RunEvents: no consumer. ErrNotFound when there is none.
// The console asks it whether a run called a tool (Requested).
func (b *Bus) FirstEvent(ctx context.Context, filter string) (StoredEvent, error) {
	raw, err := getMsg(ctx, b.stream, 1, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return StoredEvent{}, fmt.Errorf("%w: no event on %s", ErrNotFound, filter)
	}
	if err != nil {
		return StoredEvent{}, fmt.Errorf("events: first event on %s: %w", filter, err)
	}
	return StoredOf(raw), nil
}

// LastEvent returns the last event stored on subject (no wildcards), read with one
// direct get: no consumer. ErrNotFound when there is none. The console reads a run's
// step count from its last model.responded.
func (b *Bus) LastEvent(ctx context.Context, subject string) (StoredEvent, error) {
	raw, err := getLastMsg(ctx, b.stream, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return StoredEvent{}, fmt.Errorf("%w: no event on %s", ErrNotFound, subject)
	}
	if err != nil {
		return StoredEvent{}, fmt.Errorf("events: last event on %s: %w", subject, err)
	}
	return StoredOf(raw), nil
}

// Requested reports whether run requested a call of tool: a tool.requested on the
// tool's subject, which only the core publishes (the planner, and the injector again
// after a decision). Never from the tool's other subjects (waits, progress, logs,
// questions, results), which its team writes: one empty tool.log of a team's tool in
// someone's run must not pass for a call of it (who sees a run is decided by it).
func (b *Bus) Requested(ctx context.Context, run, tool string) (bool, error) {
	if !toolbus.ValidToolName(tool) {
		return false, nil // its calls are on tool.requested._unknown, with every unknown name's
	}
	_, err := b.FirstEvent(ctx, SubjectToolRequested(run, tool))
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// GetMsg reads the first message of stream from seq on subject (any subject when "").
// A stream of the bus (EventStream, Reader, Stream) reads it with a direct get that
// tells a stored message from a status (store.DirectNext) when the stream serves them.
// nats.go reads with a direct get when the stream info it cached says the stream serves
// them; a stream that stopped since (`toolbus init` gave it its read mirror, or it was
// replicated) has nobody answering them, so the info is read again and the read retried
// once: a worker opened before keeps reading.
func GetMsg(ctx context.Context, stream jetstream.Stream, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	raw, err := next(ctx, stream, seq, subject)
	if directGone(ctx, stream, err) {
		return next(ctx, stream, seq, subject)
	}
	return raw, err
}

func next(ctx context.Context, stream jetstream.Stream, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	if d, ok := stream.(*directStream); ok && d.CachedInfo().Config.AllowDirect {
		return store.DirectNext(ctx, d.nc, d.api, d.CachedInfo().Config.Name, seq, subject)
	}
	if subject == "" {
		return stream.GetMsg(ctx, seq)
	}
	return stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
}

// getMsg is GetMsg.
func getMsg(ctx context.Context, stream jetstream.Stream, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	return GetMsg(ctx, stream, seq, subject)
}

// GetLastMsg reads the last message of stream on subject, as GetMsg does.
func GetLastMsg(ctx context.Context, stream jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
	raw, err := stream.GetLastMsgForSubject(ctx, subject)
	if directGone(ctx, stream, err) {
		return stream.GetLastMsgForSubject(ctx, subject)
	}
	return raw, err
}

// getLastMsg is GetLastMsg.
func getLastMsg(ctx context.Context, stream jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
	return GetLastMsg(ctx, stream, subject)
}

// directStream is a stream of the bus: its messages are read with direct gets that
// tell a stored message from a status (store.DirectGet, DirectNext) while it serves
// them. A message anyone stored with a Status header and no data would otherwise read
// as "not found" through nats.go and hide every later message from a reader that goes
// through the stream.
type directStream struct {
	jetstream.Stream
	nc  *nats.Conn
	api string // the JetStream API prefix: $JS.API, or a client's read service's
}

func (s *directStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	if c := s.CachedInfo().Config; c.AllowDirect {
		return store.DirectGet(ctx, s.nc, s.api+".DIRECT.GET."+c.Name+"."+subject)
	}
	return s.Stream.GetLastMsgForSubject(ctx, subject)
}

// Stream looks up a stream of the bus's JetStream by name, read as the bus reads its
// event stream (GetMsg, GetLastMsg).
func (b *Bus) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	st, err := b.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return b.direct(st), nil
}

// direct wraps a stream of the bus's JetStream (its API prefix the bus's).
func (b *Bus) direct(st jetstream.Stream) jetstream.Stream {
	api := "$JS.API"
	if b.cfg.ReadPrefix != "" {
		api = b.cfg.ReadPrefix
	}
	return &directStream{Stream: st, nc: b.nc, api: api}
}

// directGone reports whether err is a direct get nobody answered on a stream that no
// longer serves them, the cached info of stream being read again.
func directGone(ctx context.Context, stream jetstream.Stream, err error) bool {
	if !errors.Is(err, nats.ErrNoResponders) || !stream.CachedInfo().Config.AllowDirect {
		return false
	}
	info, ierr := stream.Info(ctx)
	return ierr == nil && !info.Config.AllowDirect
}
