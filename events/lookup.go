package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// FirstEvent returns the first event stored on filter (a subject, wildcards allowed),
// read with one direct get like RunEvents: no consumer. ErrNotFound when there is none.
// The console asks it whether a run called a tool (SubjectRunTool).
func (b *Bus) FirstEvent(ctx context.Context, filter string) (StoredEvent, error) {
	raw, err := b.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(filter))
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
	raw, err := b.stream.GetLastMsgForSubject(ctx, subject)
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
