package injector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sourcegraph/conc"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// Config configures an injector worker. Zero fields take their defaults; New refuses
// negative ones (Validate).
type Config struct {
	// WorkerConfig: Instance (default "injector"), Concurrency (messages handled at
	// once), AckWait (before a dead injector's unacknowledged results are redelivered to
	// another), MaxDeliver (default DefaultMaxDeliver, not events.DefaultMaxDeliver: the
	// deliveries of one event, with growing delays; on the last one, a store or publish
	// that keeps failing ends the run failed with code store_error instead of
	// redelivering forever), Grace, Logger.
	workerconfig.WorkerConfig
	// Durable is the consumer name shared by all injectors (default "injector").
	Durable string
	Rules   Rules
	// Defaults are the limits of runs that set none (the deadline and max steps the
	// stop rules check, the deadline of re-issued calls); a zero MaxSteps is
	// DefaultMaxSteps.
	Defaults toolbus.DefaultLimits
	// DeadlineGrace is how long after a run's deadline its timer fires (default
	// DefaultDeadlineGrace): the time for the timed_out results of executors to land
	// first.
	DeadlineGrace time.Duration
	// MaxTimers bounds the deadline timers held at once across all injectors (the timer
	// consumer's MaxAckPending, default DefaultMaxTimers); further runs get their timer
	// as slots free up.
	MaxTimers int
	// JoinWindow bounds how long the results of a step that came in wait for the step's
	// other results before they are written to its join state, so that a step is usually
	// one write instead of two or three (steps.gather); the result that completes the
	// step is never held. Default DefaultJoinWindow; a negative value writes at once.
	JoinWindow time.Duration
	// BeforeOutcome, when set, is called between the write of a run's terminal state and
	// the publish of its outcome event; an error aborts the handler there, as a crash
	// would. Fault-injection tests use it; production leaves it nil.
	BeforeOutcome func(toolbus.RunEnded) error
	// Metrics, when set, records step joins and the runs this injector ends.
	Metrics Metrics
	// Observer, when set, watches the consume loops (readiness, redeliveries, poison).
	Observer consume.Observer
	// Deciders are the identities who may decide on and cancel every run, besides each
	// run's principal and the approvers its start lists: the decision policy of a bus
	// shared by clients that must not decide on each other's runs. nil (or an entry
	// AnyoneDecides) lets everyone, as one party on its own bus needs; an empty, non-nil
	// list lets only each run's principal and approvers. A refused decision or cancel is
	// terminated with a NotDeciderError naming who may.
	Deciders []string
	// Quota bounds each principal's runs in flight, starts per second and run.started
	// size (quota.go); zero bounds nothing.
	Quota Quota
}

// Defaults of Config (the shared ones are events.DefaultConcurrency and its siblings).
const (
	// DefaultMaxSteps is the step limit of a run that sets none, when Config.Defaults
	// sets none either.
	DefaultMaxSteps = 10
	// DefaultMaxDeliver is the default of Config.MaxDeliver.
	DefaultMaxDeliver = 10
	// DefaultDeadlineGrace is the default of Config.DeadlineGrace.
	DefaultDeadlineGrace = 2 * time.Second
	// DefaultMaxRunTimeout is the default of Config.Defaults.MaxRunTimeout: the cap of
	// any run's deadline, from its start.
	DefaultMaxRunTimeout = 24 * time.Hour
	// DefaultMaxTimers is the default of Config.MaxTimers.
	DefaultMaxTimers = 100000
	// DefaultJoinWindow is the default of Config.JoinWindow: the results of a step whose
	// calls are quick come within it; a step with a slower call costs its first results
	// that much more time before they are stored, far below any acknowledgement wait.
	DefaultJoinWindow = 5 * time.Millisecond
)

// Validate reports the first field out of range (an *workerconfig.ConfigError wrapping
// workerconfig.ErrInvalidConfig); zero values are valid.
func (c Config) Validate() error {
	if err := c.WorkerConfig.Validate(); err != nil {
		return fmt.Errorf("injector: %w", err)
	}
	var err error
	switch {
	case c.DeadlineGrace < 0:
		err = workerconfig.InvalidField("DeadlineGrace", c.DeadlineGrace, fmt.Sprintf("0s or more (0: default %v)", DefaultDeadlineGrace))
	case c.MaxTimers < 0:
		err = workerconfig.InvalidField("MaxTimers", c.MaxTimers, fmt.Sprintf("1 or more (0: default %d)", DefaultMaxTimers))
	case c.Defaults.MaxSteps < 0:
		err = workerconfig.InvalidField("Defaults.MaxSteps", c.Defaults.MaxSteps, fmt.Sprintf("1 or more (0: default %d)", DefaultMaxSteps))
	case c.Defaults.RunTimeout < 0:
		err = workerconfig.InvalidField("Defaults.RunTimeout", c.Defaults.RunTimeout, "0s (none) or more")
	case c.Defaults.TokenBudget < 0:
		err = workerconfig.InvalidField("Defaults.TokenBudget", c.Defaults.TokenBudget, "0 (none) or more")
	default:
		err = c.Quota.Validate()
	}
	if err != nil {
		return fmt.Errorf("injector: %w", err)
	}
	return nil
}

// Metrics records what an injector does. It is an interface so that this package does
// not depend on a metrics library; implementations must be safe for concurrent use.
type Metrics interface {
	// StepJoined is called after a batch of results is joined into a step's record (the
	// compare-and-set write and what follows it: the next step or the outcome).
	StepJoined(d time.Duration)
	// RunEnded is called when this injector ends a run.
	RunEnded(outcome, code string)
}

type nopMetrics struct{}

func (nopMetrics) StepJoined(time.Duration) {}
func (nopMetrics) RunEnded(string, string)  {}

func (c *Config) setDefaults() {
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	c.WorkerConfig = c.WorkerConfig.WithDefaults("injector")
	if c.Durable == "" {
		c.Durable = "injector"
	}
	if c.Defaults.MaxSteps == 0 {
		c.Defaults.MaxSteps = DefaultMaxSteps
	}
	if c.Defaults.MaxRunTimeout == 0 {
		c.Defaults.MaxRunTimeout = DefaultMaxRunTimeout
	}
	if c.DeadlineGrace == 0 {
		c.DeadlineGrace = DefaultDeadlineGrace
	}
	if c.MaxTimers == 0 {
		c.MaxTimers = DefaultMaxTimers
	}
	if c.JoinWindow == 0 {
		c.JoinWindow = DefaultJoinWindow
	}
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
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
	calls  *callCache
	// results this injector joined into steps not yet settled
	results *resultCache
	// timers are the deadline timers this injector holds (see deadline.go)
	timers heldTimers
	// timerAckWait is the acknowledgement wait of the timer consumer (a time.Duration;
	// 0 until it is known): see timerHold
	timerAckWait atomic.Int64
	// starts are the first run.started deliveries this injector keeps while their runs
	// are young (armTimer), and startsAckWait and startsMax the started consumer's
	// acknowledgement wait and MaxAckPending (0 until known: nothing is kept)
	starts                   heldTimers
	startsAckWait, startsMax atomic.Int64
	// ends are the runs known to have ended, from their outcome events: a step settles
	// without reading its run's state when they answer for the run (runState)
	ends *follow.RunOutcomes
	// quota admits new runs per principal, room while the event stream has room
	// (quota.go)
	quota *admission
	room  storeRoom
}

// New returns an injector, or the error of cfg.Validate.
func New(bus *events.Bus, cfg Config) (*Injector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	var ends *follow.RunOutcomes
	if bus != nil {
		ends = follow.Outcomes(bus)
	}
	in := &Injector{cfg: cfg, bus: bus, source: events.Source("injector", cfg.Instance), steps: newSteps(max(cfg.JoinWindow, 0)),
		timers: heldTimers{m: map[string]jetstream.Msg{}}, starts: heldTimers{m: map[string]jetstream.Msg{}}, ends: ends,
		calls: newCallCache(), results: newResultCache(), quota: newAdmission(cfg.Quota), room: storeRoom{every: storeRoomRecheck}, log: cfg.Logger.With("component", "injector", "instance", cfg.Instance)}
	if ends != nil {
		// A run's end frees its deadline timer (deadline.go).
		ends.OnEnded(func(run string, _ toolbus.RunStatus) { in.runEnded(run) })
	}
	return in, nil
}

// Run consumes results, approvals, cancellations, run.started and deadline timers until
// ctx ends, then drains. It also follows the run outcomes and the model.responded events
// (core subscriptions) so that steps read neither their run's state nor their calls when
// these answer for them.
//
// Each input has a consumer of its own (provision.WorkerConsumers) with a single filter
// subject: a multi-filter consumer intersects every subject of the stream on each
// fetch, which cost a fifth of the CPU at load.
func (in *Injector) Run(ctx context.Context) error {
	inputs := provision.WorkerConsumers(provision.RoleInjector, provision.WorkerSettings{
		Durable: in.cfg.Durable, AckWait: in.cfg.AckWait, MaxDeliver: in.cfg.MaxDeliver,
		Concurrency: in.cfg.Concurrency, MaxTimers: in.cfg.MaxTimers,
	})
	var wg conc.WaitGroup
	errs := make(chan error, len(inputs))
	if err := in.ends.Listen(ctx); err != nil {
		// Without them every step reads its run's state, as it always may,
		// and the deadline timers of ended runs are freed by their next check.
		in.log.Warn("run outcomes not followed: each step reads its run's state, timers of ended runs are freed within "+timerRecheck.String(), "error", err)
	}
	defer in.ends.Close()
	stopCalls, err := in.followCalls(ctx)
	if err != nil {
		// Without them every step reads its assistant message, as it always may.
		in.log.Warn("model.responded not followed: each step reads its assistant message", "error", err)
	}
	defer stopCalls()
	in.log.Info("injector serving", "consumer", in.cfg.Durable, "concurrency", in.cfg.Concurrency,
		"stream", in.bus.Config().Stream, "nats", in.bus.Conn().ConnectedUrlRedacted())
	defer in.log.Info("injector stopped")
	for _, input := range inputs {
		cons, err := provision.Consumer(ctx, in.bus, input.ConsumerConfig)
		if err != nil {
			return err
		}
		if input.Timers {
			wg.Go(func() { errs <- in.serveTimers(ctx, cons) })
			continue
		}
		if slices.Equal(input.Filters, []string{events.FilterRunStarted}) {
			if info := cons.CachedInfo(); info != nil {
				in.startsAckWait.Store(int64(info.Config.AckWait))
				in.startsMax.Store(int64(info.Config.MaxAckPending))
			}
		}
		wg.Go(func() {
			errs <- consume.Serve(ctx, cons, consume.Config{
				Concurrency: input.Concurrency, Grace: in.cfg.Grace, Logger: in.log, NakDelay: 500 * time.Millisecond,
				Observer: in.cfg.Observer,
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

// handle dispatches one event. Its deliveries are bounded: when the handler still fails
// for an infrastructure reason on the last one, the run ends failed with code
// store_error (best effort) and the event is terminated, so nothing loops forever.
func (in *Injector) handle(ctx context.Context, msg jetstream.Msg) error {
	start := time.Now()
	err := in.dispatch(ctx, msg)
	if derr := in.bus.Denied(start, err); errors.Is(derr, connect.ErrPermissionDenied) {
		return in.denied(ctx, msg, start, derr)
	}
	if err == nil || errors.Is(err, events.ErrPoison) || errors.Is(err, events.ErrNotCloudEvent) || errors.Is(err, consume.ErrHeld) {
		return err
	}
	md, merr := msg.Metadata()
	if merr != nil || md.NumDelivered < uint64(in.cfg.MaxDeliver) {
		return err
	}
	// Not logged here: the consume loop logs the poison error returned below, once.
	if run, ok := events.RunIDFromSubject(msg.Subject()); ok && toolbus.ValidRunID(run) {
		step, serr := in.bus.Store().CurrentStep(ctx, run)
		if serr != nil {
			// The store is what keeps failing: end the run anyway, at the step we know.
			in.log.Warn("could not read the run's step before ending it", "run_id", run, "step", step, "error", serr)
		}
		if eerr := in.end(ctx, step, toolbus.RunEnded{RunID: run, Status: toolbus.RunFailed, Code: toolbus.CodeStoreError,
			StepsUsed: step + 1, Reason: truncate("store or publish kept failing: "+err.Error(), 500)}); eerr != nil {
			in.log.Error("could not end the run after the last delivery (its deadline timer will)", "run_id", run, "error", eerr)
		}
	}
	return fmt.Errorf("%w: gave up after %d deliveries, the run ends: %w", events.ErrPoison, md.NumDelivered, err)
}

// denied ends the run of an event the injector's credentials do not let it handle, with
// the code permission_denied and a reason naming the missing permission, and terminates
// the event: no redelivery can help until the permissions change, and the run must not
// stall until its deadline.
func (in *Injector) denied(ctx context.Context, msg jetstream.Msg, start time.Time, err error) error {
	in.log.Error("event failed: the injector's credentials miss a permission; the run ends", "subject", msg.Subject(), "error", err)
	run, ok := events.RunIDFromSubject(msg.Subject())
	if !ok || !toolbus.ValidRunID(run) {
		return fmt.Errorf("%w: %w", events.ErrPoison, err)
	}
	step, serr := in.bus.Store().CurrentStep(ctx, run)
	if serr != nil && !errors.Is(serr, events.ErrNotFound) {
		in.log.Warn("could not read the run's step before ending it", "run_id", run, "step", step, "error", serr)
	}
	typ := strings.TrimPrefix(strings.TrimPrefix(msg.Subject(), events.SubjectPrefix+"."+run+"."), events.SubjectPrefix+".")
	if eerr := in.end(ctx, step, toolbus.RunEnded{RunID: run, Status: toolbus.RunFailed, Code: toolbus.CodePermissionDenied,
		StepsUsed: step + 1, Reason: truncate(fmt.Sprintf("the injector could not handle %s: %v", typ, err), 500)}); eerr != nil {
		return fmt.Errorf("%w: %w (and the run could not be ended: %w)", events.ErrPoison, err, in.bus.Denied(start, eerr))
	}
	return fmt.Errorf("%w: %w", events.ErrPoison, err)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func (in *Injector) dispatch(ctx context.Context, msg jetstream.Msg) error {
	ev, err := events.DecodeEventMsg(msg)
	if err != nil {
		return err
	}
	data := events.DataOf(ev.Type)
	if data == nil {
		return fmt.Errorf("%w: unexpected event type %q on %s", events.ErrPoison, ev.Type, msg.Subject())
	}
	if err := ev.Bind(data); err != nil {
		return err
	}
	// The subject is what the publisher's permissions allowed: an event whose body names
	// another run, tool or outcome than its subject is terminated, never applied.
	if err := events.CheckSubject(msg.Subject(), ev.Meta, data); err != nil {
		return err
	}
	if err := decisionSize(data); err != nil {
		return err
	}
	switch d := data.(type) {
	case *toolbus.ToolFinished:
		if err := in.fence(ctx, msg, *d); err != nil {
			return err
		}
		return in.Finished(ctx, *d)
	case *toolbus.ToolWaiting:
		return in.Waiting(ctx, *d)
	case *toolbus.Approval:
		return in.Decided(ctx, *d, ev.Step, ev.Type == events.TypeApprovalGranted)
	case *toolbus.Cancel:
		return in.Cancelled(ctx, *d)
	case *toolbus.RunStarted:
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("injector: metadata of %s: %w", msg.Subject(), err)
		}
		// A run.started the stream stored as its run's first message needs no read to
		// know it is the first run.started.
		if toolbus.ValidRunID(d.RunID) && in.bus.StartedFirst(*d, md.Sequence.Stream, md.Timestamp, msg.Headers()) {
			return in.started(ctx, *d, startedMsg{msg: msg, seq: md.Sequence.Stream})
		}
		return in.Started(ctx, *d, md.Sequence.Stream)
	}
	return fmt.Errorf("%w: unexpected event type %q on %s", events.ErrPoison, ev.Type, msg.Subject())
}

func validPosition(run string, step, idx, count int) error {
	if !toolbus.ValidRunID(run) || step < 0 || count <= 0 || count > store.MaxStepCalls || idx < 0 || idx >= count {
		return fmt.Errorf("%w: bad call position run=%q step=%d index=%d count=%d", events.ErrPoison, run, step, idx, count)
	}
	return nil
}

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
