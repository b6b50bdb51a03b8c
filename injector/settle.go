package injector

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
)

// Settling a complete step: what follows it (the next model request, carrying its
// results when they fit, or a run outcome) and recording and publishing that outcome.

// settled reports whether what follows a complete step was already published: the run
// asked for a later step or ended (and its outcome is on the stream). Only duplicates
// pay for this read.
func (in *Injector) settled(ctx context.Context, st *store.StepState) bool {
	if rs, _, err := in.bus.Store().RunState(ctx, st.RunID); err == nil && rs.Status.Terminal() {
		// Republish the outcome if a crash lost it (nothing when the stream has it).
		return in.publishOutcome(ctx, rs) == nil
	}
	step, err := runlog.LastModelRequest(ctx, in.bus, st.RunID)
	return err == nil && step > st.Step
}

// settle publishes what follows a step whose calls are all accounted for. It is
// idempotent: every publication has a deterministic id.
func (in *Injector) settle(ctx context.Context, st *store.StepState) error {
	if !st.Settled() {
		return nil
	}
	rs, startSeq, err := in.bus.RunStartedAt(ctx, st.RunID)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return fmt.Errorf("%w: %w", events.ErrPoison, err)
		}
		return err
	}
	state, err := in.runState(ctx, st, startSeq)
	if err != nil {
		return err
	}
	if state.Status.Terminal() {
		// The run ended; if a crash came between its state write and its outcome, the
		// outcome is published now (once: PublishOutcome skips what the stream has).
		in.log.Info("step settled after the run ended: nothing follows", "run_id", st.RunID, "step", st.Step, "status", state.Status)
		return in.publishOutcome(ctx, state)
	}
	rec, err := in.assemble(ctx, st)
	if err != nil {
		return err
	}
	if rec.Complete() {
		defer in.results.forget(stepID(st.RunID, st.Step))
	}
	if !rec.Complete() {
		pending, err := in.undecided(ctx, rec)
		if err != nil || len(pending) == 0 {
			return err // every waiting call is decided: their results are on their way
		}
		return in.end(ctx, rec.Step, toolbus.RunEnded{RunID: rec.RunID, Status: toolbus.RunWaitingForApproval,
			Pending: pending, StepsUsed: rec.Step + 1, Reason: fmt.Sprintf("%d call(s) need approval", len(pending))})
	}
	// A cancelled result comes from a run cancellation this injector may not have
	// applied yet: the run ends cancelled, it does not go on.
	if c, ok, err := in.cancelledBy(ctx, rec); err != nil {
		return err
	} else if ok {
		return in.Cancelled(ctx, c)
	}
	if ended := in.cfg.Rules.Decide(rs.WithDefaults(in.cfg.Defaults), rec); ended != nil {
		if ended.Usage == (toolbus.Usage{}) {
			ended.Usage = in.usage(ctx, rec.RunID, rec.Step+1)
		}
		return in.end(ctx, rec.Step, *ended)
	}
	if state.Status != toolbus.RunRunning {
		if err := in.bus.Store().SetRunState(ctx, rec.RunID, toolbus.RunRunning, rec.Step+1, "", ""); err != nil {
			return err
		}
	}
	_, err = in.bus.PublishEvent(ctx, events.ModelRequestedEvent(in.source, toolbus.ModelRequested{RunID: rec.RunID, Step: rec.Step + 1,
		PrevResults: carried(st, rec, in.bus.Store().InlineBudget())}).Traced(in.traceparent(ctx, rec.RunID)))
	return err
}

// traceparent is the W3C traceparent the run's run.started carries (none: ""): each
// model.requested carries it on, so the planner's step span and the step's tool events
// join the trace the run was started in (events.RunTraceContext).
func (in *Injector) traceparent(ctx context.Context, run string) string {
	tp, err := in.bus.RunTraceparent(ctx, run)
	if err != nil {
		in.log.Debug("run.started not read for its traceparent", "run_id", run, "error", err)
	}
	return tp
}

// carried returns the results of the complete step rec (whose join state is st), in
// call order and without their Output, for the next model.requested to carry when their
// encoding fits budget bytes (the history store's inline budget: at most a quarter of
// the server's max_payload); nil otherwise, and the planner reads them from the store.
// They are what the store holds for the step (rec was assembled from its join state), so
// the planner builds the same tool messages from either, and spares a read of the
// history bucket per step.
func carried(st *store.StepState, rec *store.StepRecord, budget int) []toolbus.ToolResult {
	size := 2 // the brackets of the array
	for i, r := range rec.Results {
		if r == nil {
			return nil
		}
		if raw, ok := st.Results[i]; ok {
			size += len(raw) + 1 // the inline result is its own encoding
		} else {
			size += len(store.EncodeResult(*r)) + 1
		}
		if size > budget {
			return nil
		}
	}
	out := make([]toolbus.ToolResult, len(rec.Results))
	for i, r := range rec.Results {
		out[i] = *r
		out[i].Output = nil
	}
	return out
}

// runState returns what settle needs of the run's state. While the outcome events
// answer for the run (it started after this injector followed them) and say it has not
// ended, and no call of the step waited for a person (only then can the run be waiting
// for approval), the run is running and nothing is read; otherwise the state is read.
//
// The outcome events miss an end recorded in the run state whose event is not published
// yet (a crash between the two): the step's model.requested is then published, and the
// planner, which follows the run states' writes as well (or reads the run state when
// they do not answer for the run), refuses it and
// publishes the lost outcome. So no step of an ended run is planned either way.
func (in *Injector) runState(ctx context.Context, st *store.StepState, startSeq uint64) (store.RunState, error) {
	if st.Waiting.Count() == 0 {
		if status, ok := in.ends.Lookup(st.RunID, startSeq); ok && status == "" {
			return store.RunState{RunID: st.RunID, Status: toolbus.RunRunning}, nil
		}
	}
	state, _, err := in.bus.Store().RunState(ctx, st.RunID)
	if err != nil && !errors.Is(err, events.ErrRunNotFound) {
		return state, err
	}
	return state, nil
}

// assemble is Bus.AssembleStep with the results inline in st taken from it, the ones
// this injector stored under their own keys from its cache, and the waiting calls from
// the step's cached calls: only the results other injectors stored under their own keys
// (too large to inline, or of a step joined before results were inlined) are read.
func (in *Injector) assemble(ctx context.Context, st *store.StepState) (*store.StepRecord, error) {
	rec := store.NewStepRecord(st.RunID, st.Step, st.CallCount)
	id := stepID(st.RunID, st.Step)
	for i := 0; i < st.CallCount; i++ {
		switch {
		case st.Received.Has(i):
			r, ok, err := st.Inline(i)
			if err != nil {
				return nil, err
			}
			if ok {
				rec.Results[i] = &r
				continue
			}
			if c, ok := in.results.get(id, i); ok {
				rec.Results[i] = c
				continue
			}
			if r, err = in.bus.Store().ResultOf(ctx, st, i); err != nil {
				return nil, err
			}
			rec.Results[i] = &r
		case st.Waiting.Has(i):
			calls, err := in.stepCallsFull(ctx, st.RunID, st.Step)
			if err != nil {
				return nil, err
			}
			if i < len(calls) {
				c := calls[i]
				rec.Waiting[i] = &c
			}
		}
	}
	return rec, nil
}

// undecided returns the calls of a step that wait for a decision nobody made yet.
func (in *Injector) undecided(ctx context.Context, rec *store.StepRecord) ([]toolbus.ToolCall, error) {
	var out []toolbus.ToolCall
	for _, c := range rec.Pending() {
		_, err := in.bus.Store().StepDecision(ctx, rec.RunID, rec.Step, c.CallID)
		if errors.Is(err, events.ErrNotFound) {
			out = append(out, c)
		} else if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// cancelledBy returns the run's cancellation when a result of the step was cancelled.
func (in *Injector) cancelledBy(ctx context.Context, rec *store.StepRecord) (toolbus.Cancel, bool, error) {
	for _, r := range rec.Results {
		if r != nil && r.Status == toolbus.StatusCancelled {
			return runlog.CancelRequest(ctx, in.bus, rec.RunID)
		}
	}
	return toolbus.Cancel{}, false, nil
}

// end records a run outcome and publishes it. When the run already ended otherwise, the
// stored outcome is published again if the stream lacks it (a crash between the state
// write and the publish), and nothing else happens.
func (in *Injector) end(ctx context.Context, step int, ended toolbus.RunEnded) error {
	if ended.Status.Terminal() {
		defer in.calls.forget(stepID(ended.RunID, step))
	}
	st, err := in.bus.Store().RecordEnd(ctx, step, ended)
	if errors.Is(err, events.ErrRunEnded) {
		return in.publishOutcome(ctx, st)
	}
	if err != nil {
		return err
	}
	if in.cfg.BeforeOutcome != nil {
		if err := in.cfg.BeforeOutcome(ended); err != nil {
			return err
		}
	}
	if err := in.publishOutcome(ctx, st); err != nil {
		return err
	}
	in.cfg.Metrics.RunEnded(string(ended.Status), ended.Code)
	in.log.Info("run outcome", "run_id", ended.RunID, "step", step, "status", ended.Status, "code", ended.Code)
	return nil
}

// usage sums the model usage of the run's recorded steps before upTo (best effort: it
// is reported in the outcome, never needed to decide it).
func (in *Injector) usage(ctx context.Context, run string, upTo int) toolbus.Usage {
	var u toolbus.Usage
	for s := 0; s < upTo; s++ {
		mr, err := in.bus.Store().Assistant(ctx, run, s)
		if err != nil {
			break
		}
		u = u.Add(mr.Usage)
	}
	return u
}
