package events

import (
	"context"
	"errors"

	"github.com/toolbus/toolbus/events/store"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
