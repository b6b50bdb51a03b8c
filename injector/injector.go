package injector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
)

// Config configures an injector worker.
type Config struct {
	Instance    string
	Concurrency int    // messages handled at once (default 64)
	Durable     string // consumer shared by all injectors (default "injector")
	Rules       Rules
	Grace       time.Duration
	Logger      *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Instance == "" {
		c.Instance = "injector"
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
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
func (in *Injector) Run(ctx context.Context) error {
	cons, err := in.bus.Consumer(ctx, events.ConsumerConfig{
		Durable: in.cfg.Durable,
		Filters: []string{events.FilterToolFinished, events.FilterToolWaiting, events.FilterApprovals, events.FilterRunCancel},
		AckWait: 30 * time.Second, MaxDeliver: -1, MaxAckPending: in.cfg.Concurrency * 8,
	})
	if err != nil {
		return err
	}
	return events.Serve(ctx, cons, events.ServeConfig{
		Concurrency: in.cfg.Concurrency, Grace: in.cfg.Grace, Logger: in.log, NakDelay: 500 * time.Millisecond,
	}, in.handle)
}

func (in *Injector) handle(ctx context.Context, msg jetstream.Msg) error {
	meta, err := events.DecodeMsg(msg, nil)
	if err != nil {
		return err
	}
	switch meta.Type {
	case events.TypeToolFinished:
		var tf events.ToolFinished
		if _, err := events.DecodeMsg(msg, &tf); err != nil {
			return err
		}
		return in.Finished(ctx, tf)
	case events.TypeToolWaiting:
		var tw events.ToolWaiting
		if _, err := events.DecodeMsg(msg, &tw); err != nil {
			return err
		}
		return in.Waiting(ctx, tw)
	case events.TypeApprovalGranted, events.TypeApprovalDenied:
		var a events.Approval
		if _, err := events.DecodeMsg(msg, &a); err != nil {
			return err
		}
		if a.RunID == "" {
			a.RunID = meta.RunID
		}
		return in.Decided(ctx, a, meta.Type == events.TypeApprovalGranted)
	case events.TypeRunCancel:
		var c events.Cancel
		if _, err := events.DecodeMsg(msg, &c); err != nil {
			return err
		}
		if c.RunID == "" {
			c.RunID = meta.RunID
		}
		return in.Cancelled(ctx, c)
	}
	return fmt.Errorf("%w: unexpected event type %q on %s", events.ErrPoison, meta.Type, msg.Subject())
}

func validPosition(run string, step, idx, count int) error {
	if !events.ValidRunID(run) || step < 0 || count <= 0 || count > 10000 || idx < 0 || idx >= count {
		return fmt.Errorf("%w: bad call position run=%q step=%d index=%d count=%d", events.ErrPoison, run, step, idx, count)
	}
	return nil
}

// Finished joins one result. The first result of a call stands; a duplicate changes
// nothing (but re-drives the step's decision, in case a crash interrupted it).
func (in *Injector) Finished(ctx context.Context, tf events.ToolFinished) error {
	if err := validPosition(tf.RunID, tf.Step, tf.CallIndex, tf.CallCount); err != nil {
		return err
	}
	if !tf.Result.Status.Valid() {
		return fmt.Errorf("%w: result with invalid status %q", events.ErrPoison, tf.Result.Status)
	}
	res := tf.Result
	res.Output = nil // the stream keeps it; the join keeps what the model reads
	return in.update(ctx, tf.RunID, tf.Step, tf.CallCount, func(rec *events.StepRecord) bool {
		if rec.Results[tf.CallIndex] != nil {
			if prev := rec.Results[tf.CallIndex]; prev.CallID != res.CallID || prev.Status != res.Status || prev.Content != res.Content {
				in.log.Warn("duplicate result ignored: the first result stands", "run_id", tf.RunID,
					"step", tf.Step, "call_id", res.CallID, "status", res.Status)
			}
			return false
		}
		rec.Results[tf.CallIndex] = &res
		return true
	})
}

// Waiting records a call that waits for approval.
func (in *Injector) Waiting(ctx context.Context, tw events.ToolWaiting) error {
	if err := validPosition(tw.RunID, tw.Step, tw.CallIndex, tw.CallCount); err != nil {
		return err
	}
	call := tw.Call
	return in.update(ctx, tw.RunID, tw.Step, tw.CallCount, func(rec *events.StepRecord) bool {
		if rec.Waiting[tw.CallIndex] != nil || rec.Results[tw.CallIndex] != nil {
			return false
		}
		rec.Waiting[tw.CallIndex] = &call
		return true
	})
}

// update applies change to a step's record with compare-and-set, then settles the step
// if every call is accounted for.
func (in *Injector) update(ctx context.Context, run string, step, count int, change func(*events.StepRecord) bool) error {
	id := stepID(run, step)
	st := in.steps.lock(id)
	defer st.mu.Unlock()
	for attempt := 0; ; attempt++ {
		rec, rev, cached := st.get(id)
		if !cached {
			var err error
			rec, rev, err = in.bus.Step(ctx, run, step)
			if errors.Is(err, events.ErrNotFound) {
				rec, rev, err = events.NewStepRecord(run, step, count), 0, nil
			}
			if err != nil {
				return err
			}
		}
		if rec.CallCount != count || len(rec.Results) != count || len(rec.Waiting) != count {
			return fmt.Errorf("%w: call count %d does not match the step's %d", events.ErrPoison, count, rec.CallCount)
		}
		if !change(rec) {
			return in.settle(ctx, st, id, rec, rev)
		}
		newRev, err := in.bus.PutStep(ctx, rec, rev)
		if errors.Is(err, events.ErrConflict) && attempt < 100 {
			st.drop(id) // another injector wrote it: read it again
			continue
		}
		if err != nil {
			st.drop(id)
			return err
		}
		st.put(id, rec, newRev)
		return in.settle(ctx, st, id, rec, newRev)
	}
}

// settle publishes what follows a step whose calls are all accounted for. It is
// idempotent: every publication has a deterministic id.
func (in *Injector) settle(ctx context.Context, stripe *stripe, id string, rec *events.StepRecord, rev uint64) error {
	if rec.Closed || !rec.Settled() {
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
		pending := rec.Pending()
		return in.end(ctx, rec.Step, events.RunEnded{RunID: rec.RunID, Status: events.RunWaitingForApproval,
			Pending: pending, StepsUsed: rec.Step + 1, Reason: fmt.Sprintf("%d call(s) need approval", len(pending))})
	}
	if ended := in.cfg.Rules.Decide(rs, rec); ended != nil {
		if err := in.end(ctx, rec.Step, *ended); err != nil {
			return err
		}
		return in.close(ctx, stripe, id, rec, rev)
	}
	if state.Status != events.RunRunning {
		if err := in.bus.SetRunState(ctx, rec.RunID, events.RunRunning, rec.Step+1, "", ""); err != nil {
			return err
		}
	}
	if _, err := in.bus.Publish(ctx, events.SubjectModelRequested(rec.RunID), events.Meta{
		ID: events.IDModelRequested(rec.RunID, rec.Step+1), Type: events.TypeModelRequested, Source: in.source,
		RunID: rec.RunID, Step: rec.Step + 1,
	}, events.ModelRequested{RunID: rec.RunID, Step: rec.Step + 1}); err != nil {
		return err
	}
	return in.close(ctx, stripe, id, rec, rev)
}

// close marks a complete step as decided. Losing this write is harmless: a later
// duplicate would only republish deduplicated events.
func (in *Injector) close(ctx context.Context, st *stripe, id string, rec *events.StepRecord, rev uint64) error {
	rec.Closed = true
	if _, err := in.bus.PutStep(ctx, rec, rev); err != nil && !errors.Is(err, events.ErrConflict) {
		in.log.Debug("close step", "run_id", rec.RunID, "step", rec.Step, "error", err)
	}
	st.drop(id) // a closed step takes no more writes
	return nil
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

// Decided applies an approval decision: it is recorded (the first decision stands) and
// the waiting call is issued again; the executor then runs it or rejects it as
// approval_denied.
func (in *Injector) Decided(ctx context.Context, a events.Approval, granted bool) error {
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
	rec, _, err := in.bus.Step(ctx, a.RunID, st.Step)
	if err != nil {
		if errors.Is(err, events.ErrNotFound) {
			return fmt.Errorf("%w: no waiting step for run %s", events.ErrPoison, a.RunID)
		}
		return err
	}
	idx := -1
	for i, w := range rec.Waiting {
		if w != nil && w.CallID == a.CallID {
			idx = i
		}
	}
	if idx < 0 {
		in.log.Warn("approval for a call that does not wait ignored", "run_id", a.RunID, "call_id", a.CallID)
		return nil
	}
	if rec.Results[idx] != nil {
		return nil // already decided and run
	}
	if _, err := in.bus.Decide(ctx, events.Decision{Approval: a, Granted: granted}); err != nil {
		return err
	}
	if err := in.bus.SetRunState(ctx, a.RunID, events.RunRunning, st.Step, "", ""); err != nil {
		return err
	}
	rs, err := in.bus.RunStarted(ctx, a.RunID)
	if err != nil {
		return err
	}
	call := *rec.Waiting[idx]
	_, err = in.bus.Publish(ctx, events.SubjectToolRequested(a.RunID, call.Tool), events.Meta{
		ID: events.IDToolRequested(a.RunID, rec.Step, call.CallID, true), Type: events.TypeToolRequested,
		Source: in.source, RunID: a.RunID, Step: rec.Step, CallID: call.CallID, CallIndex: idx,
		CallCount: rec.CallCount, HasCall: true,
	}, events.ToolRequested{RunID: a.RunID, Step: rec.Step, CallIndex: idx, CallCount: rec.CallCount, Call: call,
		Deadline: rs.Limits.Deadline, Principal: rs.Principal, AllowedTools: rs.AllowedTools, Approved: true})
	return err
}

// Cancelled ends a run as cancelled; executors cancel its in-flight calls on the same
// event, and later results cannot move the run back.
func (in *Injector) Cancelled(ctx context.Context, c events.Cancel) error {
	if !events.ValidRunID(c.RunID) {
		return fmt.Errorf("%w: cancel without a valid run id", events.ErrPoison)
	}
	st, _, err := in.bus.RunState(ctx, c.RunID)
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
	return in.end(ctx, st.Step, events.RunEnded{RunID: c.RunID, Status: events.RunCancelled, Code: "cancelled",
		Reason: reason, StepsUsed: st.Step + 1})
}
