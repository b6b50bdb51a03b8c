package injector

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/argcheck"
)

// What people decide about a run: approval decisions on its calls and cancels, each
// checked against the run's deciders.

// Decided applies an approval decision to the call of the run's current step: the
// decision is recorded (the first one stands) and, if the call already waits, it is
// issued again; the executor then runs it or rejects it as approval_denied. A decision
// that arrives before the call waits is kept: the executor or Waiting applies it.
// step is the step the decision names (the event's step extension): a decision binds to
// its step only, so a late or repeated decision for call_X at step 0 can never approve a
// call_X that a later step reuses. A decision for any step but the current one is
// terminated with the reason.
func (in *Injector) Decided(ctx context.Context, a toolbus.Approval, step int, granted bool) error {
	if !toolbus.ValidRunID(a.RunID) || a.CallID == "" {
		return fmt.Errorf("%w: approval without run id or call id", events.ErrPoison)
	}
	st, _, err := in.bus.Store().RunState(ctx, a.RunID)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return fmt.Errorf("%w: %w", events.ErrPoison, err)
		}
		return err
	}
	if err := in.checkDecider(ctx, a.RunID, a.Who); err != nil {
		return err
	}
	if st.Status.Terminal() {
		in.log.Warn("approval for an ended run ignored", "run_id", a.RunID, "call_id", a.CallID, "status", st.Status)
		return nil
	}
	current, err := in.bus.Store().CurrentStep(ctx, a.RunID)
	if err != nil {
		return err
	}
	if step != current {
		return fmt.Errorf("%w: decision for call %q names step %d, run %s is at step %d: it applies to that step only",
			events.ErrPoison, a.CallID, step, a.RunID, current)
	}
	mr, err := in.bus.Store().Assistant(ctx, a.RunID, current)
	if err != nil && !errors.Is(err, events.ErrNotFound) {
		return err
	}
	idx := -1
	for i, c := range mr.Message.ToolCalls {
		if c.CallID == a.CallID {
			idx = i
			break
		}
	}
	if idx < 0 {
		in.log.Warn("approval for a call the current step does not make ignored", "run_id", a.RunID, "call_id", a.CallID, "step", current)
		return nil
	}
	if err := in.checkDecision(ctx, a, granted, mr.Message.ToolCalls[idx]); err != nil {
		return err
	}
	d, err := in.bus.Store().DecideStep(ctx, current, store.Decision{Approval: a, Granted: granted})
	if err != nil {
		return err
	}
	if d.Granted != granted || d.Who != a.Who {
		in.log.Warn("a later decision ignored: the first one stands", "run_id", a.RunID, "call_id", a.CallID,
			"granted", d.Granted, "who", d.Who)
	}
	rec, _, err := in.bus.Store().Step(ctx, a.RunID, current)
	if errors.Is(err, events.ErrNotFound) {
		return nil // the call has not waited yet: the executor or Waiting applies the decision
	}
	if err != nil {
		return err
	}
	return in.reissue(ctx, rec, idx, d)
}

// checkDecider refuses (terminates, with the reason) a decision or cancel of run by who
// when the decision policy does not name who for the run.
func (in *Injector) checkDecider(ctx context.Context, run, who string) error {
	if anyoneDecides(in.cfg.Deciders) {
		return nil
	}
	rs, err := in.bus.RunStarted(ctx, run)
	if err != nil {
		return err
	}
	if err := rs.CheckDecider(in.cfg.Deciders, who); err != nil {
		in.log.Warn("decision refused by the decision policy", "run_id", run, "who", who, "error", err)
		return fmt.Errorf("%w: %w", events.ErrPoison, err)
	}
	return nil
}

// checkDecision refuses a decision that cannot apply to call: a response on
// approval.granted, edited arguments on approval.denied, or edited arguments that are not
// one JSON object valid against the tool's input schema (from the catalog). A refused
// decision is terminated with the reason and not recorded: the call still waits, and a
// corrected decision (an edit's id names its arguments) decides it.
func (in *Injector) checkDecision(ctx context.Context, a toolbus.Approval, granted bool, call toolbus.ToolCall) error {
	switch {
	case granted && a.Response != "":
		return fmt.Errorf("%w: decision on call %q of run %s refused: a response (in the tool's place) travels on approval.denied; the call still waits",
			events.ErrPoison, a.CallID, a.RunID)
	case !granted && a.Arguments != "":
		return fmt.Errorf("%w: decision on call %q of run %s refused: edited arguments travel on approval.granted; the call still waits",
			events.ErrPoison, a.CallID, a.RunID)
	case !granted || a.Arguments == "":
		return nil
	}
	tc, err := in.bus.Store().Contract(ctx, call.Tool)
	if errors.Is(err, events.ErrNotFound) {
		return fmt.Errorf("%w: edit of call %q of run %s refused: tool %q is not in the catalog, its arguments cannot be checked; the call still waits",
			events.ErrPoison, a.CallID, a.RunID, call.Tool)
	}
	if err != nil {
		return err
	}
	if err := argcheck.Check(tc.InputSchema, a.Arguments); err != nil {
		in.log.Warn("edit refused: the edited arguments do not match the tool's schema; the call still waits",
			"run_id", a.RunID, "call_id", a.CallID, "tool", call.Tool, "who", a.Who, "error", err)
		return fmt.Errorf("%w: edit of call %q of run %s by %s refused: %w; the call still waits", events.ErrPoison, a.CallID, a.RunID, a.Who, err)
	}
	return nil
}

// reissue publishes again the request of a waiting call that has a decision (dec, the
// one that stood), marked approved and carrying it (a deterministic id: several
// re-issues are one event).
func (in *Injector) reissue(ctx context.Context, rec *store.StepRecord, idx int, dec store.Decision) error {
	if idx >= len(rec.Waiting) || rec.Waiting[idx] == nil || rec.Results[idx] != nil {
		return nil // not waiting yet (Waiting re-issues), or already answered
	}
	if err := in.bus.Store().SetRunState(ctx, rec.RunID, toolbus.RunRunning, rec.Step, "", ""); err != nil {
		if errors.Is(err, events.ErrRunEnded) {
			return nil
		}
		return err
	}
	rs, err := in.bus.RunStarted(ctx, rec.RunID)
	if err != nil {
		return err
	}
	rs = rs.WithDefaults(in.cfg.Defaults)
	call := *rec.Waiting[idx]
	_, err = in.bus.PublishEvent(ctx, events.ToolRequestedEvent(in.source, toolbus.ToolRequested{
		RunID: rec.RunID, Step: rec.Step, CallIndex: idx, CallCount: rec.CallCount, Call: call,
		Deadline: rs.Limits.Deadline, Principal: rs.Principal, AllowedTools: rs.AllowedTools, Approved: true,
		Decision: &toolbus.CallDecision{Approval: dec.Approval, Granted: dec.Granted}}, true))
	return err
}

// Cancelled ends a run as cancelled; executors cancel its in-flight calls on the same
// event, and later results cannot move the run back.
func (in *Injector) Cancelled(ctx context.Context, c toolbus.Cancel) error {
	if !toolbus.ValidRunID(c.RunID) {
		return fmt.Errorf("%w: cancel without a valid run id", events.ErrPoison)
	}
	step, err := in.bus.Store().CurrentStep(ctx, c.RunID)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return fmt.Errorf("%w: %w", events.ErrPoison, err)
		}
		return err
	}
	if err := in.checkDecider(ctx, c.RunID, c.Who); err != nil {
		return err
	}
	reason := c.Reason
	if reason == "" {
		reason = "cancelled"
	}
	if c.Who != "" {
		reason += " (by " + c.Who + ")"
	}
	return in.end(ctx, step, toolbus.RunEnded{RunID: c.RunID, Status: toolbus.RunCancelled, Code: toolbus.CodeCancelled,
		Reason: reason, StepsUsed: step + 1, Usage: in.usage(ctx, c.RunID, step+1)})
}
