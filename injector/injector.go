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
	"github.com/toolbus/toolbus/events/store"
)

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
