// Package runlog reads what a run stored on the bus: its events in stream order
// (Events, Read), followed as they are stored (Watch), the first or last one on a
// subject (First, Last), and what they say of the run (Requested, CancelRequest,
// History, LastModelRequest). Readers create no consumer: they read with direct gets.
package runlog

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// First returns the first event stored on filter (a subject, wildcards allowed),
// read with one direct get like Events: no consumer. events.ErrNotFound when there is none.
// The console asks it whether a run called a tool (Requested).
func First(ctx context.Context, b *events.Bus, filter string) (StoredEvent, error) {
	raw, err := events.GetMsg(ctx, b.EventStream(), 1, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return StoredEvent{}, fmt.Errorf("%w: no event on %s", events.ErrNotFound, filter)
	}
	if err != nil {
		return StoredEvent{}, fmt.Errorf("events: first event on %s: %w", filter, err)
	}
	return StoredOf(raw), nil
}

// Last returns the last event stored on subject (no wildcards), read with one
// direct get: no consumer. events.ErrNotFound when there is none. The console reads a run's
// step count from its last model.responded.
func Last(ctx context.Context, b *events.Bus, subject string) (StoredEvent, error) {
	raw, err := events.GetLastMsg(ctx, b.EventStream(), subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return StoredEvent{}, fmt.Errorf("%w: no event on %s", events.ErrNotFound, subject)
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
func Requested(ctx context.Context, b *events.Bus, run, tool string) (bool, error) {
	if !toolbus.ValidToolName(tool) {
		return false, nil // its calls are on tool.requested._unknown, with every unknown name's
	}
	_, err := First(ctx, b, events.SubjectToolRequested(run, tool))
	if errors.Is(err, events.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}
