// Package decide serves the human decisions on a run (approve, edit, reject, respond,
// and answers to a tool's questions): it finds the call a decision is about and says why
// the run's state refuses it. Questions is the one reading of a run's questions, which
// the executor uses too (a re-run of a tool finds its question and its answer). The CLI
// (toolbus approve, deny) and the console share it, so both refuse the same cases with
// the same words.
package decide

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/argcheck"
)

// RefusedError is a decision the run's state refuses: the run is unknown or ended, the
// call was already decided or does not wait. Msg says which, for a person.
type RefusedError struct {
	Msg string
}

func (e *RefusedError) Error() string { return e.Msg }

// Waiting finds the call callID in the run's current step and checks that it still
// waits for a decision. It returns the step and the call.
func Waiting(ctx context.Context, bus *events.Bus, run, callID string) (int, toolbus.ToolCall, error) {
	st, _, err := bus.Store().RunState(ctx, run)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return 0, toolbus.ToolCall{}, &RefusedError{Msg: fmt.Sprintf("run %s not found", run)}
		}
		return 0, toolbus.ToolCall{}, err
	}
	if st.Status.Terminal() {
		return 0, toolbus.ToolCall{}, &RefusedError{Msg: fmt.Sprintf("run %s already ended: %s", run, st.Status)}
	}
	step, err := bus.Store().CurrentStep(ctx, run)
	if err != nil {
		return 0, toolbus.ToolCall{}, err
	}
	rec, _, err := bus.Store().Step(ctx, run, step)
	if err != nil && !errors.Is(err, events.ErrNotFound) {
		return 0, toolbus.ToolCall{}, err
	}
	if rec != nil {
		for i, w := range rec.Waiting {
			if w == nil || w.CallID != callID {
				continue
			}
			if i < len(rec.Results) && rec.Results[i] != nil {
				return 0, toolbus.ToolCall{}, &RefusedError{Msg: fmt.Sprintf("call %s of run %s was already decided: %s",
					callID, run, rec.Results[i].Status)}
			}
			if d, err := bus.Store().StepDecision(ctx, run, step, callID); err == nil {
				verb := "granted"
				if !d.Granted {
					verb = "denied"
				}
				return 0, toolbus.ToolCall{}, &RefusedError{Msg: fmt.Sprintf("call %s of run %s was already %s by %s",
					callID, run, verb, d.Who)}
			}
			return step, *w, nil
		}
	}
	var waiting []string
	if rec != nil {
		for _, c := range rec.Pending() {
			waiting = append(waiting, c.CallID)
		}
	}
	msg := fmt.Sprintf("call %s of run %s does not wait for approval (run %s at step %d", callID, run, st.Status, step)
	if len(waiting) > 0 {
		msg += "; waiting: " + strings.Join(waiting, ", ")
	}
	return 0, toolbus.ToolCall{}, &RefusedError{Msg: msg + ")"}
}

// WaitingAt is Waiting for a decision that names the call's step: a step other than the
// run's current one is refused (a decision binds to its call and step, and call ids
// repeat across steps). step < 0 names none.
func WaitingAt(ctx context.Context, bus *events.Bus, run, callID string, step int) (int, toolbus.ToolCall, error) {
	if step >= 0 {
		st, _, err := bus.Store().RunState(ctx, run)
		if err == nil && !st.Status.Terminal() {
			current, err := bus.Store().CurrentStep(ctx, run)
			if err != nil {
				return 0, toolbus.ToolCall{}, err
			}
			if current != step {
				return 0, toolbus.ToolCall{}, &RefusedError{Msg: fmt.Sprintf(
					"call %s of run %s: step %d is not the run's current step (%d): a decision applies to a call of the current step only",
					callID, run, step, current)}
			}
		}
	}
	return Waiting(ctx, bus, run, callID)
}

// CheckEdit refuses edited arguments for call that are not one JSON object valid
// against the tool's input schema in the catalog, before anything is published: the
// call still waits and a corrected edit can decide it.
func CheckEdit(ctx context.Context, bus *events.Bus, call toolbus.ToolCall, args string) error {
	tc, err := bus.Store().Contract(ctx, call.Tool)
	if errors.Is(err, events.ErrNotFound) {
		return &RefusedError{Msg: fmt.Sprintf("edit of call %s refused: tool %s is not in the catalog, its arguments cannot be checked", call.CallID, call.Tool)}
	}
	if err != nil {
		return err
	}
	if err := argcheck.Check(tc.InputSchema, args); err != nil {
		return &RefusedError{Msg: fmt.Sprintf("edit of call %s %s refused: %v; nothing was published, the call still waits", call.CallID, call.Tool, err)}
	}
	return nil
}
