package planner

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// The view a step is planned from: the results of the step before, the check that the
// step is current and an answer already recorded; read in one batch, or served without a
// read when this planner's cache and the carried results answer for it (viewless).

// stepView is what the planner plans a step from, besides the cache: the view current
// read, or the results the request carried when the read was skipped (viewless).
type stepView struct {
	// prev is what current read (zero when the read was skipped).
	prev store.PlanView
	// carried are the results of step-1 the request carried, which answer the calls of
	// the assistant message this planner recorded for step-1 (nil for step 0).
	carried []toolbus.ToolResult
	// skipped reports that the view was not read.
	skipped bool
}

// viewless reports whether the step req asks for can be planned without reading its
// view (current: one batched get on the history bucket), and returns the results of
// step-1 to plan it with. It can only on the request's first delivery, and when either
// req asks for step 0 of a run this planner has planned nothing of, or req carries the
// results of step-1 and this planner's cache holds the run's history up to step-1 with
// the assistant message it recorded for step-1, whose calls the results answer one to
// one (count, call ids, tools, in order). Otherwise the view is read, as on every
// redelivery.
//
// What the view serves, and what serves it instead:
//   - The results of step-1, for the history: carried. Only the injector (and admin)
//     may publish model.requested (deploy/nats/permissions.conf), and the injector
//     carries the results of the step record it assembled from the join state, which it
//     writes too: they are as trustworthy as the join state. They are used only for the
//     calls this planner recorded itself; anything else is read from the store.
//   - The check that step is current (step-1 complete; no answer for step+1): the
//     injector asks for step only once step-1 is complete, and carries its results. A
//     planner whose latest planned step of the run is step-1 reads a first delivery of
//     the request the injector published after it; a request the run went past would be
//     one published again after the stream's duplicate window dropped the copies.
//   - The reuse of an answer already recorded for step (the model is called once per
//     step): a duplicate request on its first delivery (two injectors racing, another
//     planner planned the step) calls the model, and PutAssistant (first write wins)
//     returns the answer recorded first, which is what is published and remembered; a
//     failed extra call falls back to it too (recordedAfterAll). The cost is one model
//     call, which concurrent duplicates already pay when both read before either records.
//
// The run's state is checked either way (runState: read, or known from the followed run
// ends, which include the run-state write of an end whose outcome event a crash lost):
// it refuses a step of an ended run.
func (p *Planner) viewless(req toolbus.ModelRequested, first bool) ([]toolbus.ToolResult, bool) {
	if !first {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.cache[req.RunID]
	if req.Step == 0 {
		return nil, h == nil && len(req.PrevResults) == 0
	}
	if h == nil || h.upTo != req.Step-1 || h.pending == nil || !answers(req.PrevResults, h.pending.ToolCalls) {
		return nil, false
	}
	return req.PrevResults, true
}

// answers reports whether results answer calls one to one: as many, and each in call
// order names its call's id and tool, with a valid status.
func answers(results []toolbus.ToolResult, calls []toolbus.ToolCall) bool {
	if len(results) == 0 || len(results) != len(calls) {
		return false
	}
	for i, r := range results {
		if r.CallID != calls[i].CallID || r.Tool != calls[i].Tool || !r.Status.Valid() {
			return false
		}
	}
	return true
}

// toolMessages returns the tool messages of the results of a complete step, in call
// order: what store.StepRecord.ToolMessages builds from the same results in the store.
func toolMessages(results []toolbus.ToolResult) []toolbus.Message {
	out := make([]toolbus.Message, len(results))
	for i, r := range results {
		out[i] = toolbus.ToolMessage(r)
	}
	return out
}

// current checks that step is the run's current step: step 0, or the step after a
// complete one, and not a step the run already went past. It returns what it read (one
// batched request): the join state of the step before (nil for step 0) and its results,
// which the history reuses, and the assistant message already recorded for step (nil
// when there is none).
func (p *Planner) current(ctx context.Context, run string, step int) (store.PlanView, *toolbus.ModelResponded, error) {
	v, err := p.bus.Store().PlanView(ctx, run, step)
	if err != nil {
		return store.PlanView{}, nil, err
	}
	if step > 0 && (v.Prev == nil || !v.Prev.Complete()) {
		return store.PlanView{}, nil, fmt.Errorf("%w: step %d of run %s requested before step %d completed", events.ErrPoison, step, run, step-1)
	}
	if v.Assistant == nil {
		// Nothing recorded for this step, so nothing for a later one either: a step is
		// asked for only after the calls of the step before were answered.
		return v, nil, nil
	}
	if _, err := p.bus.Store().Assistant(ctx, run, step+1); err == nil {
		return store.PlanView{}, nil, fmt.Errorf("%w: step %d of run %s requested after the run went past it", events.ErrPoison, step, run)
	} else if !errors.Is(err, events.ErrNotFound) {
		return store.PlanView{}, nil, err
	}
	return v, v.Assistant, nil
}
