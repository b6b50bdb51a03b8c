package injector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sourcegraph/conc"

	"github.com/toolbus/toolbus/events"
)

// Config configures an injector worker.
type Config struct {
	// Instance names this process in event sources and logs.
	Instance    string
	Concurrency int    // messages handled at once (default 64)
	Durable     string // consumer shared by all injectors (default "injector")
	// AckWait before a dead injector's unacknowledged results are redelivered to
	// another (default 30s).
	AckWait time.Duration
	Rules   Rules
	// Defaults are the limits of runs that set none (the deadline and max steps the
	// stop rules check, the deadline of re-issued calls).
	Defaults events.DefaultLimits
	Grace    time.Duration
	Logger   *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Instance == "" {
		c.Instance = "injector"
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.Durable == "" {
		c.Durable = "injector"
	}
	if c.Grace <= 0 {
		c.Grace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Rules.setDefaults()
}

// Injector is the injector worker.
type Injector struct {
	cfg    Config
	bus    *events.Bus
	source string
	log    *slog.Logger
	steps  *steps
}

// New returns an injector.
func New(bus *events.Bus, cfg Config) *Injector {
	cfg.setDefaults()
	return &Injector{cfg: cfg, bus: bus, source: events.Source("injector", cfg.Instance), steps: newSteps(),
		log: cfg.Logger.With("component", "injector", "instance", cfg.Instance)}
}

// Run consumes results, approvals and cancellations until ctx ends, then drains.
//
// Each input has a consumer of its own (events.WorkerConsumers) with a single filter
// subject: a multi-filter consumer intersects every subject of the stream on each
// fetch, which cost a fifth of the CPU at load.
func (in *Injector) Run(ctx context.Context) error {
	inputs := events.WorkerConsumers(events.RoleInjector, events.WorkerSettings{
		Durable: in.cfg.Durable, AckWait: in.cfg.AckWait, Concurrency: in.cfg.Concurrency,
	})
	var wg conc.WaitGroup
	errs := make(chan error, len(inputs))
	for _, input := range inputs {
		cons, err := in.bus.Consumer(ctx, input.ConsumerConfig)
		if err != nil {
			return err
		}
		wg.Go(func() {
			errs <- events.Serve(ctx, cons, events.ServeConfig{
				Concurrency: input.Concurrency, Grace: in.cfg.Grace, Logger: in.log, NakDelay: 500 * time.Millisecond,
			}, in.handle)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (in *Injector) handle(ctx context.Context, msg jetstream.Msg) error {
	ev, err := events.DecodeEventMsg(msg)
	if err != nil {
		return err
	}
	switch ev.Type {
	case events.TypeToolFinished:
		var tf events.ToolFinished
		if err := ev.Bind(&tf); err != nil {
			return err
		}
		return in.Finished(ctx, tf)
	case events.TypeToolWaiting:
		var tw events.ToolWaiting
		if err := ev.Bind(&tw); err != nil {
			return err
		}
		return in.Waiting(ctx, tw)
	case events.TypeApprovalGranted, events.TypeApprovalDenied:
		var a events.Approval
		if err := ev.Bind(&a); err != nil {
			return err
		}
		if a.RunID == "" {
			a.RunID = ev.RunID
		}
		return in.Decided(ctx, a, ev.Step, ev.Type == events.TypeApprovalGranted)
	case events.TypeRunCancel:
		var c events.Cancel
		if err := ev.Bind(&c); err != nil {
			return err
		}
		if c.RunID == "" {
			c.RunID = ev.RunID
		}
		return in.Cancelled(ctx, c)
	}
	return fmt.Errorf("%w: unexpected event type %q on %s", events.ErrPoison, ev.Type, msg.Subject())
}

func validPosition(run string, step, idx, count int) error {
	if !events.ValidRunID(run) || step < 0 || count <= 0 || count > 10000 || idx < 0 || idx >= count {
		return fmt.Errorf("%w: bad call position run=%q step=%d index=%d count=%d", events.ErrPoison, run, step, idx, count)
	}
	return nil
}

// Finished joins one result. The first result of a call stands; a duplicate changes
// nothing (but re-drives the step's decision, in case a crash interrupted it), and a
// duplicate whose content differs is reported as poison (terminated with the reason).
func (in *Injector) Finished(ctx context.Context, tf events.ToolFinished) error {
	if err := validPosition(tf.RunID, tf.Step, tf.CallIndex, tf.CallCount); err != nil {
		return err
	}
	if !tf.Result.Status.Valid() {
		return fmt.Errorf("%w: result with invalid status %q", events.ErrPoison, tf.Result.Status)
	}
	res := tf.Result
	res.Output = nil // the stream keeps it; the join keeps what the model reads
	conflict := false
	err := in.update(ctx, tf.RunID, tf.Step, tf.CallCount, func(rec *events.StepRecord) bool {
		if rec.Results[tf.CallIndex] != nil {
			prev := rec.Results[tf.CallIndex]
			conflict = prev.CallID != res.CallID || prev.Status != res.Status || prev.Content != res.Content
			return false
		}
		rec.Results[tf.CallIndex] = &res
		return true
	})
	if err == nil && conflict {
		// Terminated (not acknowledged) so that the termination advisory tells operators.
		return fmt.Errorf("%w: duplicate result for call %q (run %s step %d index %d) differs from the joined one: the first result stands",
			events.ErrPoison, res.CallID, tf.RunID, tf.Step, tf.CallIndex)
	}
	return err
}

// Waiting records a call that waits for approval.
func (in *Injector) Waiting(ctx context.Context, tw events.ToolWaiting) error {
	if err := validPosition(tw.RunID, tw.Step, tw.CallIndex, tw.CallCount); err != nil {
		return err
	}
	call := tw.Call
	if err := in.update(ctx, tw.RunID, tw.Step, tw.CallCount, func(rec *events.StepRecord) bool {
		if rec.Waiting[tw.CallIndex] != nil || rec.Results[tw.CallIndex] != nil {
			return false
		}
		rec.Waiting[tw.CallIndex] = &call
		return true
	}); err != nil {
		return err
	}
	// The decision may have come before the call waited: apply it now.
	if _, err := in.bus.StepDecision(ctx, tw.RunID, tw.Step, call.CallID); err != nil {
		if errors.Is(err, events.ErrNotFound) {
			return nil
		}
		return err
	}
	rec, _, err := in.bus.Step(ctx, tw.RunID, tw.Step)
	if err != nil {
		return err
	}
	return in.reissue(ctx, rec, tw.CallIndex)
}

// update applies change to a step's record with compare-and-set, then settles the step
// if every call is accounted for. Changes to one step that arrive while a write of that
// step is in flight are applied together in the next write (group commit): a step of K
// results costs about two writes, not K, and a handler returns only once its change is
// stored.
func (in *Injector) update(ctx context.Context, run string, step, count int, change func(*events.StepRecord) bool) error {
	return in.steps.submit(stepID(run, step), change, func(ops []func(*events.StepRecord) bool, cached *cachedStep) (*cachedStep, error) {
		return in.apply(ctx, run, step, count, ops, cached)
	})
}

// apply writes a batch of changes to one step and settles it.
func (in *Injector) apply(ctx context.Context, run string, step, count int, ops []func(*events.StepRecord) bool, cached *cachedStep) (*cachedStep, error) {
	for attempt := 0; ; attempt++ {
		var (
			rec *events.StepRecord
			rev uint64
		)
		optimistic := false
		switch {
		case cached != nil:
			rec, rev = cached.clone(), cached.rev
		case attempt == 0:
			// Most steps are new to this injector: create the record without reading it
			// first; if it exists, the create fails and it is read.
			rec, rev, optimistic = events.NewStepRecord(run, step, count), 0, true
		default:
			var err error
			rec, rev, err = in.bus.Step(ctx, run, step)
			if errors.Is(err, events.ErrNotFound) {
				rec, rev, err = events.NewStepRecord(run, step, count), 0, nil
			}
			if err != nil {
				return nil, err
			}
		}
		if rec.CallCount != count || len(rec.Results) != count || len(rec.Waiting) != count {
			return nil, fmt.Errorf("%w: call count %d does not match the step's %d", events.ErrPoison, count, rec.CallCount)
		}
		changed := false
		for _, op := range ops {
			if op(rec) {
				changed = true
			}
		}
		if !changed && optimistic {
			continue // nothing to create: read the stored record
		}
		if !changed {
			// Only duplicates: settle again (idempotent) unless the step was already settled.
			if rec.Complete() && in.settled(ctx, rec) {
				return &cachedStep{rec: rec, rev: rev}, nil
			}
			return &cachedStep{rec: rec, rev: rev}, in.settle(ctx, rec)
		}
		newRev, err := in.bus.PutStep(ctx, rec, rev)
		if errors.Is(err, events.ErrConflict) && attempt < 100 {
			cached = nil // another injector wrote it: read it again
			continue
		}
		if err != nil {
			return nil, err
		}
		next := &cachedStep{rec: rec, rev: newRev}
		return next, in.settle(ctx, rec)
	}
}

// settled reports whether what follows a complete step was already published: the run
// asked for a later step or ended. Only duplicates pay for this read.
func (in *Injector) settled(ctx context.Context, rec *events.StepRecord) bool {
	if st, _, err := in.bus.RunState(ctx, rec.RunID); err == nil && st.Status.Terminal() {
		return true
	}
	step, err := in.bus.LastModelRequest(ctx, rec.RunID)
	return err == nil && step > rec.Step
}

// settle publishes what follows a step whose calls are all accounted for. It is
// idempotent: every publication has a deterministic id.
func (in *Injector) settle(ctx context.Context, rec *events.StepRecord) error {
	if !rec.Settled() {
		return nil
	}
	rs, err := in.bus.RunStarted(ctx, rec.RunID)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return fmt.Errorf("%w: %w", events.ErrPoison, err)
		}
		return err
	}
	state, _, err := in.bus.RunState(ctx, rec.RunID)
	if err != nil && !errors.Is(err, events.ErrRunNotFound) {
		return err
	}
	if state.Status.Terminal() {
		in.log.Info("step settled after the run ended: nothing follows", "run_id", rec.RunID, "step", rec.Step, "status", state.Status)
		return nil
	}
	if !rec.Complete() {
		pending, err := in.undecided(ctx, rec)
		if err != nil || len(pending) == 0 {
			return err // every waiting call is decided: their results are on their way
		}
		return in.end(ctx, rec.Step, events.RunEnded{RunID: rec.RunID, Status: events.RunWaitingForApproval,
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
		if ended.Usage == (events.Usage{}) {
			ended.Usage = in.usage(ctx, rec.RunID, rec.Step+1)
		}
		return in.end(ctx, rec.Step, *ended)
	}
	if state.Status != events.RunRunning {
		if err := in.bus.SetRunState(ctx, rec.RunID, events.RunRunning, rec.Step+1, "", ""); err != nil {
			return err
		}
	}
	_, err = in.bus.Publish(ctx, events.SubjectModelRequested(rec.RunID), events.Meta{
		ID: events.IDModelRequested(rec.RunID, rec.Step+1), Type: events.TypeModelRequested, Source: in.source,
		RunID: rec.RunID, Step: rec.Step + 1,
	}, events.ModelRequested{RunID: rec.RunID, Step: rec.Step + 1})
	return err
}

// undecided returns the calls of a step that wait for a decision nobody made yet.
func (in *Injector) undecided(ctx context.Context, rec *events.StepRecord) ([]events.ToolCall, error) {
	var out []events.ToolCall
	for _, c := range rec.Pending() {
		_, err := in.bus.StepDecision(ctx, rec.RunID, rec.Step, c.CallID)
		if errors.Is(err, events.ErrNotFound) {
			out = append(out, c)
		} else if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// cancelledBy returns the run's cancellation when a result of the step was cancelled.
func (in *Injector) cancelledBy(ctx context.Context, rec *events.StepRecord) (events.Cancel, bool, error) {
	for _, r := range rec.Results {
		if r != nil && r.Status == events.StatusCancelled {
			return in.bus.CancelRequest(ctx, rec.RunID)
		}
	}
	return events.Cancel{}, false, nil
}

func (in *Injector) end(ctx context.Context, step int, ended events.RunEnded) error {
	err := in.bus.EndRun(ctx, in.source, step, ended)
	if errors.Is(err, events.ErrRunEnded) {
		return nil
	}
	if err == nil {
		in.log.Info("run outcome", "run_id", ended.RunID, "step", step, "status", ended.Status, "code", ended.Code)
	}
	return err
}

// Decided applies an approval decision to the call of the run's current step: the
// decision is recorded (the first one stands) and, if the call already waits, it is
// issued again; the executor then runs it or rejects it as approval_denied. A decision
// that arrives before the call waits is kept: the executor or Waiting applies it.
// step is the step the decision names (the event's step extension); a decision for an
// earlier step is stale and ignored. 0 is taken to mean "the current step", for
// publishers that do not set the extension.
func (in *Injector) Decided(ctx context.Context, a events.Approval, step int, granted bool) error {
	if !events.ValidRunID(a.RunID) || a.CallID == "" {
		return fmt.Errorf("%w: approval without run id or call id", events.ErrPoison)
	}
	st, _, err := in.bus.RunState(ctx, a.RunID)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return fmt.Errorf("%w: %w", events.ErrPoison, err)
		}
		return err
	}
	if st.Status.Terminal() {
		in.log.Warn("approval for an ended run ignored", "run_id", a.RunID, "call_id", a.CallID, "status", st.Status)
		return nil
	}
	current, err := in.bus.CurrentStep(ctx, a.RunID)
	if err != nil {
		return err
	}
	if step != 0 && step != current {
		in.log.Warn("approval for another step ignored", "run_id", a.RunID, "call_id", a.CallID, "step", step, "current_step", current)
		return nil
	}
	mr, err := in.bus.Assistant(ctx, a.RunID, current)
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
	d, err := in.bus.DecideStep(ctx, current, events.Decision{Approval: a, Granted: granted})
	if err != nil {
		return err
	}
	if d.Granted != granted || d.Who != a.Who {
		in.log.Warn("a later decision ignored: the first one stands", "run_id", a.RunID, "call_id", a.CallID,
			"granted", d.Granted, "who", d.Who)
	}
	rec, _, err := in.bus.Step(ctx, a.RunID, current)
	if errors.Is(err, events.ErrNotFound) {
		return nil // the call has not waited yet: the executor or Waiting applies the decision
	}
	if err != nil {
		return err
	}
	return in.reissue(ctx, rec, idx)
}

// reissue publishes again the request of a waiting call that has a decision, marked
// approved (a deterministic id: several re-issues are one event).
func (in *Injector) reissue(ctx context.Context, rec *events.StepRecord, idx int) error {
	if idx >= len(rec.Waiting) || rec.Waiting[idx] == nil || rec.Results[idx] != nil {
		return nil // not waiting yet (Waiting re-issues), or already answered
	}
	if err := in.bus.SetRunState(ctx, rec.RunID, events.RunRunning, rec.Step, "", ""); err != nil {
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
	_, err = in.bus.Publish(ctx, events.SubjectToolRequested(rec.RunID, call.Tool), events.Meta{
		ID: events.IDToolRequested(rec.RunID, rec.Step, call.CallID, true), Type: events.TypeToolRequested,
		Source: in.source, RunID: rec.RunID, Step: rec.Step, CallID: call.CallID, CallIndex: idx,
		CallCount: rec.CallCount, HasCall: true,
	}, events.ToolRequested{RunID: rec.RunID, Step: rec.Step, CallIndex: idx, CallCount: rec.CallCount, Call: call,
		Deadline: rs.Limits.Deadline, Principal: rs.Principal, AllowedTools: rs.AllowedTools, Approved: true})
	return err
}

// Cancelled ends a run as cancelled; executors cancel its in-flight calls on the same
// event, and later results cannot move the run back.
func (in *Injector) Cancelled(ctx context.Context, c events.Cancel) error {
	if !events.ValidRunID(c.RunID) {
		return fmt.Errorf("%w: cancel without a valid run id", events.ErrPoison)
	}
	step, err := in.bus.CurrentStep(ctx, c.RunID)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return fmt.Errorf("%w: %w", events.ErrPoison, err)
		}
		return err
	}
	reason := c.Reason
	if reason == "" {
		reason = "cancelled"
	}
	if c.Who != "" {
		reason += " (by " + c.Who + ")"
	}
	return in.end(ctx, step, events.RunEnded{RunID: c.RunID, Status: events.RunCancelled, Code: events.CodeCancelled,
		Reason: reason, StepsUsed: step + 1, Usage: in.usage(ctx, c.RunID, step+1)})
}

// usage sums the model usage of the run's recorded steps before upTo (best effort: it
// is reported in the outcome, never needed to decide it).
func (in *Injector) usage(ctx context.Context, run string, upTo int) events.Usage {
	var u events.Usage
	for s := 0; s < upTo; s++ {
		mr, err := in.bus.Assistant(ctx, run, s)
		if err != nil {
			break
		}
		u = u.Add(mr.Usage)
	}
	return u
}
