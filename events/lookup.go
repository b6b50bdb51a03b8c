package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FirstEvent returns the first event stored on filter (a subject, wildcards allowed),
// read with one direct get like RunEvents: no consumer. ErrNotFound when there is none.
// The console asks it whether a run called a tool (SubjectRunTool).
func (b *Bus) FirstEvent(ctx context.Context, filter string) (StoredEvent, error) {
	raw, err := getMsg(ctx, b.stream, 1, jetstream.WithGetMsgSubject(filter))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return StoredEvent{}, fmt.Errorf("%w: no event on %s", ErrNotFound, filter)
	}
	if err != nil {
		return StoredEvent{}, fmt.Errorf("events: first event on %s: %w", filter, err)
	}
	return storedOf(raw), nil
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
	return storedOf(raw), nil
}

// SubjectRunTool is toolbus.<run>.tool.*.<tool>: the requests, waits and results of one
// tool in one run.
func SubjectRunTool(run, tool string) string {
	return SubjectPrefix + "." + run + ".tool.*." + ToolToken(tool)
}

// getMsg reads one message of stream. nats.go reads with a direct get when the stream
// info it cached says the stream serves them; a stream that stopped since (`toolbus
// init` gave it its read mirror, or it was replicated) has nobody answering them, so
// the info is read again and the read retried once: a worker opened before keeps
// reading.
func getMsg(ctx context.Context, stream jetstream.Stream, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	raw, err := stream.GetMsg(ctx, seq, opts...)
	if directGone(ctx, stream, err) {
		return stream.GetMsg(ctx, seq, opts...)
	}
	return raw, err
}

// getLastMsg reads the last message of stream on subject, as getMsg does.
func getLastMsg(ctx context.Context, stream jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
	raw, err := stream.GetLastMsgForSubject(ctx, subject)
	if directGone(ctx, stream, err) {
		return stream.GetLastMsgForSubject(ctx, subject)
	}
	return raw, err
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
