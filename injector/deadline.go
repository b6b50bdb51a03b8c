package injector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/store"
)

// Deadlines by timer. Each run with a deadline that is still going half the started
// consumer's acknowledgement wait after its start (or whose deadline is nearer than
// that wait) gets one timer event on the stream (armTimer; until then the run's
// unacknowledged run.started stands in for it). The timer consumer holds it with a
// negative acknowledgement delayed until the deadline plus DeadlineGrace: the server
// keeps the timer, durable across injector restarts, and redelivers it to any injector
// when it is due. A timer not due within the consumer's acknowledgement wait is first
// kept unanswered for half of that wait (timerHold): most runs end by then, and their
// timer costs one acknowledgement instead of a hand-back and an acknowledgement. A run
// therefore ends by its deadline even when a step never completes (a lost call, a tool
// no executor serves, an executor stopped mid-step).
//
// JetStream message schedules (Nats-Schedule) were the other candidate: on this server
// a stream that allows them is forced to allow roll-ups and purges, so any publisher of
// an event could erase the audit trail with a Nats-Rollup header; the delayed
// negative acknowledgement needs no change to the stream.
//
// Time spent waiting for approval counts toward the deadline: a run left waiting past
// its deadline ends limit_reached / deadline with its pending calls listed.
//
// A held timer takes one of the MaxTimers slots, so a timer must not outlive its run:
// the injector that holds it keeps its delivery in memory (heldTimers) and
// acknowledges it as soon as it hears the run's outcome (the outcome events, which
// every injector follows: RunOutcomes.OnEnded), and a timer is held at most timerRecheck at a time, after
// which it is checked again (and acknowledged if its run ended), so the timers of an
// injector that restarted free their slots too. The client chooses the deadline; the
// injector caps it (Config.Defaults.MaxRunTimeout).

// timerRetry is the delay before a timer whose handling failed is tried again.
const timerRetry = 2 * time.Second

// timerRecheck bounds how long a timer is held before it is checked again: the longest
// an ended run keeps its timer slot when no injector that held the timer heard its
// outcome (the injector restarted, or the outcome event was missed).
const timerRecheck = 5 * time.Minute

// heldTimers are the deliveries of deadline timers this injector handed back with a
// delay (one per run; their number is bounded by the timer consumer's MaxAckPending).
type heldTimers struct {
	mu sync.Mutex
	m  map[string]jetstream.Msg
}

// hold records msg as the held timer of run.
func (h *heldTimers) hold(run string, msg jetstream.Msg) {
	h.mu.Lock()
	h.m[run] = msg
	h.mu.Unlock()
}

// take removes and returns the held timer of run (nil when none).
func (h *heldTimers) take(run string) jetstream.Msg {
	h.mu.Lock()
	defer h.mu.Unlock()
	msg := h.m[run]
	delete(h.m, run)
	return msg
}

// holdFor runs then (the timer's hand-back) after d unless msg was taken meanwhile
// (its run ended: it was acknowledged) or replaced (a redelivery of the timer is held
// instead).
func (h *heldTimers) holdFor(run string, msg jetstream.Msg, d time.Duration, then func()) {
	time.AfterFunc(d, func() {
		h.mu.Lock()
		held := h.m[run] == msg
		h.mu.Unlock()
		if held {
			then()
		}
	})
}

// nak hands msg back for d unless it was taken meanwhile (then it was acknowledged).
func (h *heldTimers) nak(run string, msg jetstream.Msg, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m[run] == msg {
		_ = msg.NakWithDelay(d)
	}
}

// len is the number of timers held.
func (h *heldTimers) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}

// runEnded frees the timer of a run that ended, if this injector holds it. The
// acknowledgement goes straight to the delivery's reply subject: the client refuses a
// second acknowledgement of a message it already handed back, the server takes it (it
// acknowledges by stream sequence, whatever the delivery).
func (in *Injector) runEnded(run string) {
	if msg := in.timers.take(run); msg != nil && msg.Reply() != "" {
		_ = in.bus.Conn().Publish(msg.Reply(), []byte("+ACK"))
	}
	if msg := in.starts.take(run); msg != nil && msg.Reply() != "" {
		_ = in.bus.Conn().Publish(msg.Reply(), []byte("+ACK")) // the run ended young: no timer
	}
}

// armTimer publishes the deadline timer of a run that has a deadline, or keeps the
// run's first run.started delivery (sm) instead for a while (startHold) and returns
// consume.ErrHeld: most runs end within seconds, and a run that ended before the hold is
// over needs no timer (its end acknowledges the run.started: runEnded); one still going
// then gets its timer, published before the run.started is acknowledged. Until then
// the unacknowledged run.started is what keeps the deadline safe: if this injector dies,
// the server redelivers it after the consumer's acknowledgement wait, which is before
// the deadline (startHold), and the injector it goes to publishes the timer (started,
// on a redelivery).
func (in *Injector) armTimer(ctx context.Context, run string, deadline time.Time, sm startedMsg) error {
	if deadline.IsZero() {
		return nil
	}
	if sm.msg != nil {
		if hold := in.startHold(time.Until(deadline.Add(in.cfg.DeadlineGrace))); hold > 0 {
			in.starts.hold(run, sm.msg)
			in.starts.holdFor(run, sm.msg, hold, func() { in.youngRunOver(run, deadline, sm) })
			return consume.ErrHeld
		}
	}
	_, err := in.bus.PublishEvent(ctx, events.TimerEvent(in.source, events.RunTimer{RunID: run, Deadline: deadline}))
	return err
}

// youngRunOver ends the hold of a run's first run.started (armTimer): a run that has
// not ended gets its timer, and the run.started is acknowledged.
func (in *Injector) youngRunOver(run string, deadline time.Time, sm startedMsg) {
	if in.starts.take(run) != sm.msg {
		return // acknowledged by the run's end meanwhile
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !in.runHasEnded(ctx, run, sm.seq) {
		if _, err := in.bus.PublishEvent(ctx, events.TimerEvent(in.source, events.RunTimer{RunID: run, Deadline: deadline})); err != nil {
			in.log.Warn("deadline timer not published: the run.started goes back, to arm it again", "run_id", run, "error", err)
			_ = sm.msg.NakWithDelay(timerRetry)
			return
		}
	}
	if err := sm.msg.Ack(); err != nil {
		in.log.Debug("run.started not acknowledged after its hold", "run_id", run, "error", err)
	}
}

// startHold is how long the first run.started of a run due in wait may be kept
// (armTimer): half the started consumer's acknowledgement wait, when the deadline is
// not within that wait (a redelivery after this injector died comes before it), the
// consumer's MaxAckPending leaves room for it (kept deliveries count there: this
// injector keeps at most an eighth of it, so runs keep starting whatever it keeps, also
// beside other injectors) and it is known; 0 otherwise, and the timer is published at
// once.
func (in *Injector) startHold(wait time.Duration) time.Duration {
	if maxPending := int(in.startsMax.Load()); maxPending < minKeptStartsPending || in.starts.len() >= maxPending/8 {
		return 0
	}
	return quietHold(time.Duration(in.startsAckWait.Load()), wait)
}

// quietHold is how long a delivery due in wait may be kept without a word to the server
// of a consumer whose acknowledgement wait is ackWait: the server redelivers a delivery
// it heard nothing about after ackWait, so the hold is half of it, and only for what is
// not due within ackWait, so that if this injector dies meanwhile the redelivery still
// comes before the due time. 0 otherwise (and for an unknown ackWait).
func quietHold(ackWait, wait time.Duration) time.Duration {
	if ackWait <= 0 || wait < ackWait {
		return 0
	}
	return ackWait / 2
}

// minKeptStartsPending is the least MaxAckPending of the started consumer under which
// no run.started is kept: one set up before the consumer's limit was raised for it
// (provision) would otherwise fill with kept deliveries and hold new runs back.
const minKeptStartsPending = 1024

// serveTimers consumes deadline timers until ctx ends.
func (in *Injector) serveTimers(ctx context.Context, cons jetstream.Consumer) error {
	if info := cons.CachedInfo(); info != nil {
		in.timerAckWait.Store(int64(info.Config.AckWait))
	}
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var wg sync.WaitGroup
	// gate orders the callback's wg.Add before the final wg.Wait: a delivery that the
	// stopped loop still hands over goes back to the server at once.
	var (
		gate    sync.Mutex
		stopped bool
	)
	slots := make(chan struct{}, 8)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		slots <- struct{}{}
		gate.Lock()
		if stopped {
			gate.Unlock()
			<-slots
			_ = msg.Nak()
			return
		}
		wg.Add(1)
		gate.Unlock()
		go func() {
			defer func() { <-slots; wg.Done() }()
			in.timer(workCtx, msg)
		}()
	}, jetstream.PullMaxMessages(64), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, jetstream.ErrNoHeartbeat) {
			in.log.Debug("timer consume", "error", err)
		}
	}))
	if err != nil {
		return fmt.Errorf("injector: consume timers: %w", err)
	}
	<-ctx.Done()
	// Drained, not stopped: a stop drops what the server already sent, unacknowledged
	// until its AckWait; drained, the callback hands each back at once (consume.Serve
	// does the same).
	cc.Drain()
	gate.Lock()
	stopped = true
	gate.Unlock()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(in.cfg.Grace):
		cancelWork()
		<-done
	}
	return nil
}

// timer handles one delivery of a run's deadline timer: not due yet, it is handed back
// until it is; due, the run's deadline is enforced.
func (in *Injector) timer(ctx context.Context, msg jetstream.Msg) {
	defer func() {
		if r := recover(); r != nil {
			in.log.Error("deadline timer panic", "subject", msg.Subject(), "panic", r)
			_ = msg.NakWithDelay(timerRetry)
		}
	}()
	var t events.RunTimer
	meta, err := events.DecodeMsg(msg, &t)
	run, _ := events.RunIDFromSubject(msg.Subject())
	if err == nil && meta.Type != events.TypeRunTimer {
		err = fmt.Errorf("%w: a %s event on the timer subject %s", events.ErrPoison, meta.Type, msg.Subject())
	}
	if err == nil {
		err = events.CheckSubject(msg.Subject(), meta, &t)
	}
	if err == nil && !toolbus.ValidRunID(run) {
		err = fmt.Errorf("%w: invalid run id %q", events.ErrPoison, run)
	}
	if err != nil {
		in.log.Warn("not a deadline timer of this run: terminated", "subject", msg.Subject(), "error", err)
		_ = msg.TermWithReason(truncate("not a deadline timer of this run: "+err.Error(), 200))
		return
	}
	// The deadline is the run's own (its first run.started), not what the timer says.
	rs, startSeq, err := in.bus.RunStartedAt(ctx, run)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			_ = msg.TermWithReason("timer of a run that was never started")
			return
		}
		_ = msg.NakWithDelay(timerRetry)
		return
	}
	deadline := rs.WithDefaults(in.cfg.Defaults).Limits.Deadline
	if deadline.IsZero() {
		_ = msg.Ack()
		return
	}
	if wait := time.Until(deadline.Add(in.cfg.DeadlineGrace)); wait > 0 {
		// Not due: the server holds it until then, or until the next check (a slot of
		// MaxAckPending, no goroutine), unless the run ends first. It is recorded as held
		// before the run's end is looked up, so an outcome published meanwhile frees it.
		in.timers.hold(run, msg)
		if in.runHasEnded(ctx, run, startSeq) {
			in.runEnded(run)
			return
		}
		if hold := in.timerHold(wait); hold > 0 {
			in.timers.holdFor(run, msg, hold, func() { in.timers.nak(run, msg, min(wait-hold, timerRecheck)) })
			return
		}
		in.timers.nak(run, msg, min(wait, timerRecheck))
		return
	}
	in.timers.take(run) // due: no longer held
	if err := in.Deadline(ctx, run, deadline); err != nil {
		in.log.Warn("deadline timer failed, trying again", "run_id", run, "error", err)
		_ = msg.NakWithDelay(timerRetry)
		return
	}
	_ = msg.Ack()
}

// timerHold is how long a timer delivery not due for wait is kept without a word to the
// server before it is handed back with a delay: most runs end within seconds, and the
// acknowledgement their end sends then is the only message their timer costs after its
// delivery (a hand-back first would be one more). The server redelivers a delivery it
// heard nothing about after the timer consumer's acknowledgement wait, so the hold is
// half of that, and only for a timer not due before that wait is over: if this injector
// dies while it holds the timer, the redelivery still comes before the deadline. 0 when
// the timer is handed back at once.
func (in *Injector) timerHold(wait time.Duration) time.Duration {
	return quietHold(time.Duration(in.timerAckWait.Load()), wait)
}

// runHasEnded reports whether a run whose timer is not due yet has ended. The outcome
// events answer without a read while they answer for the run; otherwise the run state is
// read. An end recorded whose outcome event a crash lost is not seen by the events: the
// timer is then held until its next check (timerRecheck), which reads the run state.
func (in *Injector) runHasEnded(ctx context.Context, run string, startSeq uint64) bool {
	if in.ends != nil {
		if status, ok := in.ends.Lookup(run, startSeq); ok {
			return status.Terminal()
		}
	}
	st, _, err := in.bus.Store().RunState(ctx, run)
	return err == nil && st.Status.Terminal()
}

// Deadline ends a run whose deadline passed while it still runs (or waits for approval):
// each call of its current step with no result gets a timed_out result from the
// injector (error code timeout), then the run ends limit_reached / deadline with those
// calls listed in Unanswered. A run that already ended is left alone, except that its
// outcome is published if a crash lost it. It is idempotent: the outcome is recorded
// first, whole, and every publication has a deterministic id.
func (in *Injector) Deadline(ctx context.Context, run string, deadline time.Time) error {
	st, _, err := in.bus.Store().RunState(ctx, run)
	if err != nil {
		return err
	}
	if st.Status.Terminal() && (st.Ended == nil || st.Ended.Code != toolbus.LimitDeadline || len(st.Ended.Unanswered) == 0) {
		return in.publishOutcome(ctx, st)
	}
	stored := st
	if !st.Status.Terminal() {
		if stored, err = in.recordDeadline(ctx, run, deadline); err != nil || stored.Ended == nil {
			return err
		}
	}
	// From here on, the stored outcome (this attempt's or a crashed one's) names the calls.
	step, unanswered := stored.Step, stored.Ended.Unanswered
	defer in.calls.forget(stepID(run, step))
	calls, err := in.stepCalls(ctx, run, step)
	if err != nil && !errors.Is(err, events.ErrNotFound) {
		return err
	}
	index := make(map[string]int, len(calls))
	for i, c := range calls {
		index[c.CallID] = i
	}
	join, _, err := in.bus.Store().StepState(ctx, run, step)
	if err != nil && !errors.Is(err, events.ErrNotFound) {
		return err
	}
	futures := make([]*events.PubFuture, 0, len(unanswered))
	for _, c := range unanswered {
		i, ok := index[c.CallID]
		if !ok {
			continue
		}
		undecided, err := in.waitedForApproval(ctx, join, i, c.CallID)
		if err != nil {
			return err
		}
		res := deadlineResult(c, in.source, deadline, undecided)
		f, err := in.bus.PublishEventAsync(ctx, events.ToolFinishedEvent(in.source,
			toolbus.ToolFinished{RunID: run, Step: step, CallIndex: i, CallCount: len(calls), ToolResult: res}))
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	if err := events.AwaitAcks(ctx, futures); err != nil {
		return err
	}
	if in.cfg.BeforeOutcome != nil {
		if err := in.cfg.BeforeOutcome(*stored.Ended); err != nil {
			return err
		}
	}
	if err := in.publishOutcome(ctx, stored); err != nil {
		return err
	}
	in.cfg.Metrics.RunEnded(string(stored.Status), stored.Code)
	in.log.Info("run outcome", "run_id", run, "step", step, "status", stored.Status, "code", stored.Code,
		"unanswered", len(unanswered))
	return nil
}

// deadlineResult is the timed_out result the injector gives a call of a run whose
// deadline passed with no result for it: undecided says it waited for an approval
// nobody gave (the approval timed out), else no executor answered it.
func deadlineResult(c toolbus.ToolCall, source string, deadline time.Time, undecided bool) toolbus.ToolResult {
	at := deadline.UTC().Format(time.RFC3339)
	content, msg := "no executor answered this call before the run's deadline", "no executor answered before the run's deadline "+at
	if undecided {
		content, msg = "the approval timed out: nobody approved or denied this call before the run's deadline",
			"the approval timed out: nobody approved or denied the call before the run's deadline "+at
	}
	return toolbus.ToolResult{CallID: c.CallID, Tool: c.Tool, Status: toolbus.StatusTimedOut, Executor: source,
		Content: content, Error: &toolbus.ToolError{Code: toolbus.CodeTimeout, Message: msg}}
}

// waitedForApproval reports whether call callID (index i of the step of join state st, nil
// when none) waited for approval and no decision on it was recorded.
func (in *Injector) waitedForApproval(ctx context.Context, st *store.StepState, i int, callID string) (bool, error) {
	if st == nil || !st.Waiting.Has(i) {
		return false, nil
	}
	_, err := in.bus.Store().StepDecision(ctx, st.RunID, st.Step, callID)
	if errors.Is(err, events.ErrNotFound) {
		return true, nil
	}
	return false, err
}

// recordDeadline stores the deadline outcome of a running run, listing the calls of its
// current step that have no result. When the run ended otherwise meanwhile, it
// republishes that outcome if needed and returns an empty state (nothing more to do).
func (in *Injector) recordDeadline(ctx context.Context, run string, deadline time.Time) (store.RunState, error) {
	step, err := in.bus.Store().CurrentStep(ctx, run)
	if err != nil {
		return store.RunState{}, err
	}
	calls, err := in.stepCallsFull(ctx, run, step) // the outcome lists them whole
	if err != nil && !errors.Is(err, events.ErrNotFound) {
		return store.RunState{}, err // not found: the step's model call is under way, no calls yet
	}
	var received store.Bits
	if js, _, err := in.bus.Store().StepState(ctx, run, step); err == nil {
		received = js.Received
	} else if !errors.Is(err, events.ErrNotFound) {
		return store.RunState{}, err
	}
	var unanswered []toolbus.ToolCall
	for i, c := range calls {
		if !received.Has(i) {
			unanswered = append(unanswered, c)
		}
	}
	ended := toolbus.RunEnded{RunID: run, Status: toolbus.RunLimitReached, Code: toolbus.LimitDeadline,
		StepsUsed: step + 1, Unanswered: unanswered, Usage: in.usage(ctx, run, step+1),
		Reason: fmt.Sprintf("run deadline %s passed with %d call(s) of step %d unanswered",
			deadline.UTC().Format(time.RFC3339), len(unanswered), step)}
	stored, err := in.bus.Store().RecordEnd(ctx, step, ended)
	if errors.Is(err, events.ErrRunEnded) {
		return store.RunState{}, in.publishOutcome(ctx, stored)
	}
	return stored, err
}
