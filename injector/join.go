package injector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/store"
)

// Joining a result: checked against the calls of its step's recorded assistant message,
// fenced against a later attempt of its call, then written into the step's join state
// (grouped per step), which settles the step once every call is accounted for.

// checkCall verifies that a call position and identity match the step's recorded
// assistant message: a result or wait for a call the model did not make, at another
// index, with another tool or another call count, is poison.
func (in *Injector) checkCall(ctx context.Context, run string, step, idx, count int, callID, tool string) error {
	calls, err := in.stepCalls(ctx, run, step)
	if errors.Is(err, events.ErrNotFound) {
		return fmt.Errorf("%w: run %s step %d has no recorded assistant message", events.ErrPoison, run, step)
	}
	if err != nil {
		return err
	}
	switch {
	case count != len(calls):
		return fmt.Errorf("%w: call count %d does not match the %d calls of run %s step %d", events.ErrPoison, count, len(calls), run, step)
	case calls[idx].CallID != callID:
		return fmt.Errorf("%w: call %q is not call %d (%q) of run %s step %d", events.ErrPoison, callID, idx, calls[idx].CallID, run, step)
	case calls[idx].Tool != tool:
		return fmt.Errorf("%w: call %q names tool %q, the model asked for %q", events.ErrPoison, callID, tool, calls[idx].Tool)
	}
	return nil
}

// stepCalls returns the call ids and tools of a step's recorded assistant message, from
// its model.responded event when the injector heard it (followCalls), else read once
// and cached (the first recorded message stands forever). The arguments may be missing:
// stepCallsFull has them.
func (in *Injector) stepCalls(ctx context.Context, run string, step int) ([]toolbus.ToolCall, error) {
	return in.readCalls(ctx, run, step, false)
}

// stepCallsFull is stepCalls with the calls' arguments.
func (in *Injector) stepCallsFull(ctx context.Context, run string, step int) ([]toolbus.ToolCall, error) {
	return in.readCalls(ctx, run, step, true)
}

func (in *Injector) readCalls(ctx context.Context, run string, step int, full bool) ([]toolbus.ToolCall, error) {
	return in.calls.get(ctx, stepID(run, step), full, func() ([]toolbus.ToolCall, error) {
		mr, err := in.bus.Store().Assistant(ctx, run, step)
		if err != nil {
			return nil, err
		}
		return mr.Message.ToolCalls, nil
	})
}

// Finished joins one result. The result must match its call in the step's recorded
// assistant message. It is kept inline in the step's join state, written by the
// compare-and-set that marks it received; one too large for the state's inline budget
// is first stored under its own key (where the first result stands), then marked. The
// first result the join state marks stands: a duplicate changes nothing (but re-drives
// the step's decision, in case a crash interrupted it), and a duplicate whose content
// differs is reported as poison (terminated with the reason).
func (in *Injector) Finished(ctx context.Context, tf toolbus.ToolFinished) error {
	if err := validPosition(tf.RunID, tf.Step, tf.CallIndex, tf.CallCount); err != nil {
		return err
	}
	if !tf.ToolResult.Status.Valid() {
		return fmt.Errorf("%w: result with invalid status %q", events.ErrPoison, tf.ToolResult.Status)
	}
	if err := in.checkCall(ctx, tf.RunID, tf.Step, tf.CallIndex, tf.CallCount, tf.ToolResult.CallID, tf.ToolResult.Tool); err != nil {
		return err
	}
	res := tf.ToolResult
	res.Output = nil
	// The call is the core's (checkCall): a reference its result names is kept only
	// when it is that call's own; another (another team's output) is withheld, said so.
	owner := store.OutputOwner{Tool: res.Tool, Run: tf.RunID, Step: tf.Step, CallID: res.CallID}
	if n := store.WithholdForeignRefs(owner, &res); n > 0 {
		in.log.Warn("result names outputs that are not its call's: withheld", "run_id", tf.RunID, "step", tf.Step,
			"call_id", res.CallID, "tool", res.Tool, "withheld", n)
	}
	id, idx := stepID(tf.RunID, tf.Step), tf.CallIndex
	raw := store.EncodeResult(res)
	budget := in.bus.Store().InlineBudget()
	// What the last application of the change found (a change is applied again when its
	// compare-and-set loses): the call's result already marked (prev), or no room.
	var (
		prev *store.StepState
		full bool
	)
	// mark marks the call received: with its result inline when inline is set and the
	// result fits, or only the mark (its result under its own key already).
	mark := func(inline bool) func(*store.StepState) bool {
		return func(st *store.StepState) bool {
			prev, full = nil, false
			if st.Received.Has(idx) {
				prev = st.Clone()
				return false
			}
			if !inline {
				return st.Received.Set(idx)
			}
			joined, noRoom := st.JoinInline(idx, raw, budget)
			full = noRoom
			return joined
		}
	}
	if len(raw) > store.InlineResultMax {
		full = true // never inline: no round for it
	} else if err := in.update(ctx, tf.RunID, tf.Step, tf.CallCount, mark(true)); err != nil {
		return err
	}
	stored := res
	if full {
		// Overflow: under its own key first (the first there stands), then marked, so
		// a reader that sees the mark finds the key.
		var err error
		if stored, _, err = in.bus.Store().PutResult(ctx, tf.RunID, tf.Step, idx, res); err != nil {
			return err
		}
		in.results.put(id, idx, stored)
		if err := in.update(ctx, tf.RunID, tf.Step, tf.CallCount, mark(false)); err != nil {
			return err
		}
	}
	if prev != nil {
		// The call was marked already (a duplicate, or another result marked meanwhile):
		// the result the join state marks stands.
		var err error
		if stored, err = in.bus.Store().ResultOf(ctx, prev, idx); err != nil {
			return err
		}
	}
	if stored.Status != res.Status || stored.Content != res.Content {
		// Terminated (not acknowledged) so that the termination advisory tells operators.
		return fmt.Errorf("%w: duplicate result for call %q (run %s step %d index %d) differs from the joined one: the first result stands",
			events.ErrPoison, res.CallID, tf.RunID, tf.Step, tf.CallIndex)
	}
	return nil
}

// fence decides whether a result an executor attempt produced may be joined. A result
// the stream stored before its attempt's fencing deadline (LeaseUntil, by the server's
// clock) was stored while that attempt held the call: it is joined, at no cost. One
// stored later comes from an executor that was cut off or paused, its publication
// delivered late: it is joined only if no later attempt owns the call. While a later
// attempt's owner is alive and has not yielded to this result, it is handed back
// (DeferError), so that the later attempt's result, when it comes, is the one joined
// (this one is then a differing duplicate and terminated). The wait is bounded: on its
// last delivery, or once that owner is gone, the result is joined after all, so a call
// never loses its only result.
func (in *Injector) fence(ctx context.Context, msg jetstream.Msg, tf toolbus.ToolFinished) error {
	res := tf.ToolResult
	if res.LeaseUntil == nil || res.Attempt < 1 {
		return nil
	}
	md, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("injector: metadata of %s: %w", msg.Subject(), err)
	}
	if md.Timestamp.Before(*res.LeaseUntil) {
		return nil
	}
	queue := events.ToolTokenOfSubject(msg.Subject())
	c, _, err := in.bus.Store().CurrentClaim(ctx, queue, tf.RunID, tf.Step, res.CallID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	case c.Attempt <= res.Attempt || c.Yielded:
		return nil
	}
	alive, err := in.bus.Store().InstanceAlive(ctx, c.Team, c.Instance, c.Boot)
	if err != nil {
		return err
	}
	log := in.log.With("run_id", tf.RunID, "step", tf.Step, "call_id", res.CallID, "attempt", res.Attempt,
		"owner_attempt", c.Attempt, "owner", c.Instance, "stored", md.Timestamp, "lease_until", *res.LeaseUntil)
	if !alive || md.NumDelivered >= uint64(in.cfg.MaxDeliver) {
		log.Warn("late result of a superseded attempt joined: the attempt that owns the call is gone or did not answer in time")
		return nil
	}
	log.Info("late result of a superseded attempt held back: a later attempt owns the call")
	return &consume.DeferError{Delay: min(time.Second<<min(md.NumDelivered-1, 6), time.Minute),
		Reason: fmt.Sprintf("result of attempt %d stored after its lease; attempt %d owns the call", res.Attempt, c.Attempt)}
}

// update applies change to a step's join state with compare-and-set, then settles the
// step if every call is accounted for. Changes to one step are written together: those
// that arrive while a write of that step is in flight go into the next write (group
// commit), and a write that would not account for every call first waits up to
// Config.JoinWindow for the others (steps.gather), so a step of K quick calls usually
// costs one write of its join state, not K. A handler returns only once its change is
// stored. The join state is a few bit sets and the results
// that fit its inline budget, so it stays bounded whatever the number of calls and the
// size of their results.
func (in *Injector) update(ctx context.Context, run string, step, count int, change func(*store.StepState) bool) error {
	return in.steps.submit(stepID(run, step), change, count, func(ops []func(*store.StepState) bool, cached *cachedStep) (*cachedStep, error) {
		next, err := in.apply(ctx, run, step, count, ops, cached)
		if err == nil && next != nil && next.st.Complete() {
			in.calls.forget(stepID(run, step)) // its results are all in: no more checks
		}
		return next, err
	})
}

// apply writes a batch of changes to one step and settles it.
func (in *Injector) apply(ctx context.Context, run string, step, count int, ops []func(*store.StepState) bool, cached *cachedStep) (*cachedStep, error) {
	start := time.Now()
	defer func() { in.cfg.Metrics.StepJoined(time.Since(start)) }()
	for attempt := 0; ; attempt++ {
		var (
			st  *store.StepState
			rev uint64
		)
		optimistic := false
		switch {
		case cached != nil:
			st, rev = cached.st.Clone(), cached.rev
		case attempt == 0:
			// Most steps are new to this injector: create the state without reading it
			// first; if it exists, the create fails and it is read.
			st, rev, optimistic = store.NewStepState(run, step, count), 0, true
		default:
			var err error
			st, rev, err = in.bus.Store().StepState(ctx, run, step)
			if errors.Is(err, events.ErrNotFound) {
				st, rev, err = store.NewStepState(run, step, count), 0, nil
			}
			if err != nil {
				return nil, err
			}
		}
		if st.CallCount != count {
			return nil, fmt.Errorf("%w: call count %d does not match the step's %d", events.ErrPoison, count, st.CallCount)
		}
		changed := false
		for _, op := range ops {
			if op(st) {
				changed = true
			}
		}
		if !changed && optimistic {
			continue // nothing to create: read the stored state
		}
		if !changed {
			// Only duplicates: settle again (idempotent) unless the step was already settled.
			if st.Complete() && in.settled(ctx, st) {
				return &cachedStep{st: st, rev: rev}, nil
			}
			return &cachedStep{st: st, rev: rev}, in.settle(ctx, st)
		}
		newRev, err := in.bus.Store().PutStepState(ctx, st, rev)
		if errors.Is(err, events.ErrConflict) && attempt < 100 {
			cached = nil // another injector wrote it: read it again
			continue
		}
		if err != nil {
			return nil, err
		}
		next := &cachedStep{st: st, rev: newRev}
		return next, in.settle(ctx, st)
	}
}
