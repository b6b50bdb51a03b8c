package injector

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// Starting a run: the first run.started of a run id records the run, asks for step 0
// and arms its deadline timer; a later one is terminated.

// Started starts a run on its FIRST run.started (seq is the event's stream sequence):
// it records the run as running, arms its deadline timer and asks for step 0. A later
// run.started for the same run id (a resubmission after the duplicate window, or a
// forgery) is terminated with the reason and changes nothing: a run id names one run
// forever.
func (in *Injector) Started(ctx context.Context, rs toolbus.RunStarted, seq uint64) error {
	if !toolbus.ValidRunID(rs.RunID) {
		return fmt.Errorf("%w: run.started with an invalid run id %q", events.ErrPoison, rs.RunID)
	}
	first, err := in.bus.RunStartedSeq(ctx, rs.RunID)
	if err != nil {
		return err
	}
	if first != seq {
		return fmt.Errorf("%w: run %s already exists (started by the run.started at sequence %d): this later run.started changes nothing",
			events.ErrPoison, rs.RunID, first)
	}
	return in.started(ctx, rs, startedMsg{})
}

// startedMsg is the delivery of a run's first run.started, when the injector may keep it
// (armTimer); zero otherwise.
type startedMsg struct {
	msg jetstream.Msg
	seq uint64 // its stream sequence
}

// started starts a run whose run.started is known to be its first: it records the run
// as running, asks for step 0 and arms the run's deadline timer (armTimer).
func (in *Injector) started(ctx context.Context, rs toolbus.RunStarted, sm startedMsg) error {
	created, err := in.bus.Store().CreateRunState(ctx, rs.RunID, rs.StartedAt)
	if err != nil {
		return err
	}
	step0 := true
	if !created {
		// A redelivery: ask for step 0 again (a deterministic id) only while the run has
		// not gone past its start, and arm the timer of a run that has not ended (its
		// first delivery may have been kept, and its keeper died: armTimer).
		st, _, err := in.bus.Store().RunState(ctx, rs.RunID)
		if err != nil {
			return err
		}
		if st.Status.Terminal() {
			return nil
		}
		if st.Status != toolbus.RunRunning || st.Step != 0 {
			step0 = false
		} else if _, err := in.bus.Store().Assistant(ctx, rs.RunID, 0); err == nil {
			step0 = false
		} else if !errors.Is(err, events.ErrNotFound) {
			return err
		}
		sm = startedMsg{} // the timer is published at once
	}
	if step0 {
		// A redelivery before step 0 is checked again: a refusal whose end failed
		// must not start the run the next time.
		if ok, err := in.admitted(ctx, rs); !ok {
			return err // refused: the run ended failed (quota_exceeded), nothing else happens
		}
	}
	full, err := in.bus.RunStarted(ctx, rs.RunID)
	if err != nil {
		return err
	}
	full = full.WithDefaults(in.cfg.Defaults)
	if step0 {
		if _, err := in.bus.PublishEvent(ctx, events.ModelRequestedEvent(in.source, toolbus.ModelRequested{RunID: rs.RunID, Step: 0}).Traced(in.traceparent(ctx, rs.RunID))); err != nil {
			return err
		}
	}
	return in.armTimer(ctx, rs.RunID, full.Limits.Deadline, sm)
}
