package injector

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// Waiting records a call that waits for approval. A decision made before the call
// waited is applied at once (the call is issued again). Otherwise the run waits from
// now on, while the other calls of the step run on: whoever watches it learns at once
// that a person is needed (run.waiting_for_approval, announced by announceWaiting),
// not only once the step's slowest call is done.
func (in *Injector) Waiting(ctx context.Context, tw toolbus.ToolWaiting) error {
	if err := validPosition(tw.RunID, tw.Step, tw.CallIndex, tw.CallCount); err != nil {
		return err
	}
	if err := in.checkCall(ctx, tw.RunID, tw.Step, tw.CallIndex, tw.CallCount, tw.Call.CallID, tw.Call.Tool); err != nil {
		return err
	}
	if err := in.update(ctx, tw.RunID, tw.Step, tw.CallCount, func(st *store.StepState) bool {
		if st.Received.Has(tw.CallIndex) {
			return false
		}
		return st.Waiting.Set(tw.CallIndex)
	}); err != nil {
		return err
	}
	// The decision may have come before the call waited: apply it now.
	dec, err := in.bus.Store().StepDecision(ctx, tw.RunID, tw.Step, tw.Call.CallID)
	if errors.Is(err, events.ErrNotFound) {
		return in.announceWaiting(ctx, tw.RunID, tw.Step)
	}
	if err != nil {
		return err
	}
	rec, _, err := in.bus.Store().Step(ctx, tw.RunID, tw.Step)
	if err != nil {
		return err
	}
	return in.reissue(ctx, rec, tw.CallIndex, dec)
}

// announceWaiting makes the run wait for the undecided calls of a step that are
// waiting while other calls of the step still run. A step whose calls are all
// accounted for is left to settle, which announces the same (a set announced twice is
// one event: its id names the set, events.PendingSet). The calls still running go on,
// and their results are joined as they come; a decision made meanwhile issues its call
// again (Decided) and the run runs again.
func (in *Injector) announceWaiting(ctx context.Context, run string, step int) error {
	st, _, err := in.bus.Store().StepState(ctx, run, step)
	if err != nil {
		return err
	}
	if st.Settled() {
		return nil
	}
	rec := store.NewStepRecord(run, step, st.CallCount)
	var calls []toolbus.ToolCall
	for i := range st.CallCount {
		if !st.Waiting.Has(i) || st.Received.Has(i) {
			continue
		}
		if calls == nil {
			if calls, err = in.stepCallsFull(ctx, run, step); err != nil {
				return err
			}
		}
		if i < len(calls) {
			rec.Waiting[i] = &calls[i]
		}
	}
	pending, err := in.undecided(ctx, rec)
	if err != nil || len(pending) == 0 {
		return err
	}
	return in.end(ctx, step, toolbus.RunEnded{RunID: run, Status: toolbus.RunWaitingForApproval,
		Pending: pending, StepsUsed: step + 1, Reason: fmt.Sprintf("%d call(s) need approval", len(pending))})
}
