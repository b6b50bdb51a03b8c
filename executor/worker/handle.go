package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/executor"
)

// How a delivery of a call is handled. Worker.handle passes it through named stages,
//
//	admit → decide → execute → publish
//
// admit decodes the call, checks it against its subject and its run, takes the lease,
// the run's slot and the call's claim (or finds the call done elsewhere); decide refuses
// what must not run (run ended, unknown tool, not allowed, denied) or parks a call that
// waits for a person; execute runs the tool; publish stores the one result. The
// concerns that cut across them are middleware in the watermill style
// (func(handlerFunc) handlerFunc): the permission-denied answer around everything, then,
// once the call is admitted, tracing, metrics, logging and the "last delivery → poison
// result" rule.

// delivery is one delivery of a call as it passes through the stages. Each stage fills
// what the later ones read.
type delivery struct {
	msg   jetstream.Msg
	start time.Time    // when the delivery was taken: bus.Denied compares with it
	base  *slog.Logger // the worker's logger; log adds the call's fields

	// Filled by admit.
	req      toolbus.ToolRequested
	meta     events.Meta
	decoded  bool   // req and meta hold the decoded call
	queue    string // the tool token of the subject: scopes every write of the call
	rs       *toolbus.RunStarted
	startSeq uint64
	lv       leaseView // the lease as this call holds it
	own      owned     // the claim this worker holds

	// Filled by decide and execute, read by publish and the middleware.
	res       toolbus.ToolResult     // the result; Status "" until a stage sets it
	ran       bool                   // the tool ran: the in-flight gauge counted it
	parked    bool                   // the call waits for a person: nothing is published
	edit      *toolbus.HumanDecision // a person's edit of the arguments, applied by decide
	approved  *toolbus.HumanDecision // a person's plain approval, named in the result (Human)
	published bool                   // the result is stored in the stream
}

// log returns the call's logger. It is built only when something is logged: With is
// not free and this is the hot path.
func (d *delivery) log() *slog.Logger {
	return d.base.With("run_id", d.req.RunID, "step", d.req.Step, "call_id", d.req.Call.CallID, "tool", d.req.Call.Tool)
}

// attempt is the execution of the call this delivery is, counted by its claim.
func (d *delivery) attempt() int { return d.own.claim.Attempt }

// handlerFunc handles a delivery. It returns nil once the delivery may be acknowledged;
// any other error is mapped to an acknowledgement kind by consume.ServeAll.
type handlerFunc func(ctx context.Context, d *delivery) error

// middleware wraps a handlerFunc with a concern that is not a stage.
type middleware func(handlerFunc) handlerFunc

// chain wraps h in mws, the first outermost.
func chain(h handlerFunc, mws ...middleware) handlerFunc {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// pipeline is the whole handling of a delivery; New builds it once.
func (w *Worker) pipeline() handlerFunc {
	admitted := chain(w.process, w.traced, w.counted, w.logged, w.lastDelivery)
	return chain(admitted, w.permissionDenied, w.admit)
}

// handle is the consume.ServeAll handler of every queue.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) error {
	return w.handler(ctx, &delivery{msg: msg, start: time.Now(), base: w.log})
}

// process runs the stages after admission; a lease lost in any of them hands the call
// back.
func (w *Worker) process(ctx context.Context, d *delivery) error {
	err := w.decide(ctx, d)
	if err == nil && !d.parked {
		err = w.execute(ctx, d)
		if err == nil {
			err = w.retryLater(ctx, d)
		}
		if err == nil {
			err = w.publish(ctx, d)
		}
	}
	if errors.Is(err, errLeaseLost) {
		return w.handBack(ctx, d)
	}
	return err
}

// admit decodes the delivery and admits the call: a well-formed call of a started run
// from its own tool's queue, with a valid lease, not already handled by this process,
// within its run's slots, and claimed by this worker. It calls next with the call
// admitted and releases what it took once next returns. A call done elsewhere is
// acknowledged without next. A call of a run that already ended is admitted with its
// run_ended result set, so that it still gets its one result.
func (w *Worker) admit(next handlerFunc) handlerFunc {
	return func(ctx context.Context, d *delivery) error {
		if err := w.decode(d); err != nil {
			return err
		}
		// The run, not the call event, says what the call may do: allowlist, principal
		// and deadline come from the run's first run.started.
		var err error
		d.rs, d.startSeq, err = w.runOf(ctx, d.req)
		if err != nil {
			if errors.Is(err, events.ErrRunNotFound) {
				return fmt.Errorf("%w: call %s of a run that was never started", events.ErrPoison, d.meta.ID)
			}
			return err
		}
		if !w.lease.valid() {
			// Cut off from the bus (or just resumed from a pause): a claim taken now
			// could be taken over before the lease is renewed.
			return &consume.DeferError{Delay: max(w.beatEvery(), time.Second), Reason: "no valid lease: instance heartbeat not renewed"}
		}
		// The call holds the lease as it is now: a lapse from here on loses it for good.
		d.lv = w.lease.view()
		key := store.ClaimKey(d.queue, d.req.RunID, d.req.Step, d.req.Call.CallID)
		if !w.hold(key) {
			// This process already handles the call (a redelivery that overtook it):
			// that handling acknowledges it.
			return &consume.DeferError{Delay: max(w.beatEvery(), time.Second), Reason: "call already being handled by this process"}
		}
		defer w.release(key)
		releaseSlot, err := w.runSlot(ctx, d, key)
		if err != nil {
			return err
		}
		defer releaseSlot()
		mine, own, err := w.claim(ctx, d.msg, d.queue, d.req, d.log)
		if err != nil || !mine {
			return err
		}
		d.own = own
		ended, err := w.runEnded(ctx, d.req.RunID, d.startSeq)
		if err != nil {
			return err
		}
		if ended != "" {
			d.res = executor.ErrorResult(d.req.Call, toolbus.StatusCancelled, toolbus.CodeRunEnded,
				fmt.Sprintf("the run had already ended (%s) when this call was taken: it was not run", ended))
		}
		return next(ctx, d)
	}
}

// decode decodes the call and checks it against its subject and its queue.
func (w *Worker) decode(d *delivery) error {
	var req toolbus.ToolRequested
	meta, err := events.DecodeMsg(d.msg, &req)
	if err != nil {
		return err
	}
	d.req, d.meta, d.decoded = req, meta, true
	if meta.Type != events.TypeToolRequested || !toolbus.ValidRunID(req.RunID) || req.Step < 0 ||
		req.CallCount <= 0 || req.CallIndex < 0 || req.CallIndex >= req.CallCount {
		return fmt.Errorf("%w: bad tool.requested %s (run %q, index %d of %d)", events.ErrPoison, meta.ID, req.RunID, req.CallIndex, req.CallCount)
	}
	// The subject the call was published on names its run and tool: a call whose body
	// names another run or tool is not run.
	subject := events.CallSubject(d.msg.Subject(), d.msg.Headers())
	if err := events.CheckSubject(subject, meta, &req); err != nil {
		return err
	}
	// The queue the call came from (the subject's tool token) scopes everything the call
	// writes: its claim, its stored output and its result's subject, which the team's
	// credentials allow for its own tools only. A call from the unknown-tool queue,
	// which every team serves, is never run.
	d.queue = events.ToolTokenOfSubject(d.msg.Subject())
	if d.queue != events.ToolTokenOfSubject(subject) {
		return fmt.Errorf("%w: tool.requested %s published on %s is on the queue of %q", events.ErrPoison, meta.ID, subject, d.queue)
	}
	if d.queue != events.UnknownToolToken && d.queue != events.ToolToken(req.Call.Tool) {
		return fmt.Errorf("%w: tool.requested %s for tool %q on the queue of %q", events.ErrPoison, meta.ID, req.Call.Tool, d.queue)
	}
	return nil
}

// runSlot takes one of the run's slots for a call of a large step, or defers the
// delivery when the run is at its cap; the returned func gives the slot back.
//
// A run's calls in flight are those of its current step: the next step is asked for
// only once every call of this one has a result or waits for approval. A step of at
// most RunMaxInFlight calls therefore stays under the cap by itself, and only the calls
// of larger steps take one of the run's slots (a KV create and a delete each).
func (w *Worker) runSlot(ctx context.Context, d *delivery, key string) (release func(), err error) {
	if w.cfg.RunMaxInFlight <= 0 || d.req.CallCount <= w.cfg.RunMaxInFlight {
		return func() {}, nil
	}
	slot, ok, err := w.bus.Store().AcquireRunSlot(ctx, d.queue, d.req.RunID, w.cfg.RunMaxInFlight, key, w.cfg.Team, w.cfg.Instance, w.boot)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &consume.DeferError{Delay: runFullDelay + time.Duration(rand.Int64N(int64(runFullDelay))),
			Reason: fmt.Sprintf("run %s has %d calls in flight", d.req.RunID, w.cfg.RunMaxInFlight)}
	}
	return func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := w.bus.Store().ReleaseRunSlot(rctx, d.queue, d.req.RunID, slot); err != nil {
			d.log().Warn("run slot not released; it frees when this instance's heartbeat expires", "error", err)
		}
	}, nil
}

// runOf returns what the run says of the call: the run's first run.started, or, in a
// team account, where only the core publishes tool.requested and the team may not read
// runs, what the call carries of it (principal, allowlist, deadline).
func (w *Worker) runOf(ctx context.Context, req toolbus.ToolRequested) (*toolbus.RunStarted, uint64, error) {
	if w.bus.TeamAccount() {
		return &toolbus.RunStarted{RunID: req.RunID, Principal: req.Principal, AllowedTools: req.AllowedTools,
			Limits: toolbus.Limits{Deadline: req.Deadline}}, 0, nil
	}
	return w.bus.RunStartedAt(ctx, req.RunID)
}

// decisionOf returns a person's decision on the call (ErrNotFound when none): from the
// approval store, or, in a team account, from the re-issued call that carries it.
func (w *Worker) decisionOf(ctx context.Context, req toolbus.ToolRequested) (store.Decision, error) {
	if !w.bus.TeamAccount() {
		return w.bus.Store().StepDecision(ctx, req.RunID, req.Step, req.Call.CallID)
	}
	if !req.Approved || req.Decision == nil {
		return store.Decision{}, fmt.Errorf("%w: decision on call %s", events.ErrNotFound, req.Call.CallID)
	}
	return store.Decision{Approval: req.Decision.Approval, Granted: req.Decision.Granted}, nil
}

// decide settles what the call gets without running: a refusal (unknown tool, not
// allowed, denied by a person) as its result, or, for a call that needs a person who has
// not decided yet, no result: the claim is released and tool.waiting published (the
// call's re-issue after the decision claims it anew). A result set by an earlier stage
// stands.
func (w *Worker) decide(ctx context.Context, d *delivery) error {
	if d.res.Status != "" {
		return nil
	}
	call := d.req.Call
	switch {
	case d.queue == events.UnknownToolToken || !w.serves(call.Tool):
		d.res = executor.ErrorResult(call, toolbus.StatusRejected, toolbus.CodeUnknownTool, fmt.Sprintf("no executor serves a tool named %q", call.Tool))
		return nil
	case !d.rs.Allows(call.Tool):
		d.res = executor.ErrorResult(call, toolbus.StatusRejected, toolbus.CodeNotAuthorized, fmt.Sprintf("tool %q is not allowed in this run", call.Tool))
		return nil
	}
	t, _ := w.exec.Registry().Lookup(call.Tool)
	if !t.NeedsApproval {
		return nil
	}
	dec, err := w.decisionOf(ctx, d.req)
	switch {
	case errors.Is(err, events.ErrNotFound):
		if err := w.bus.Store().ReleaseClaim(ctx, d.queue, d.req.RunID, d.req.Step, call.CallID); err != nil {
			return err
		}
		d.parked = true
		return w.wait(ctx, d.req, d.log())
	case err != nil:
		return err
	case !dec.Granted && dec.Response != "":
		d.res = responded(call, dec.Approval)
	case !dec.Granted:
		msg := "a person denied this call"
		if dec.Why != "" {
			msg += ": " + dec.Why
		}
		d.res = executor.ErrorResult(call, toolbus.StatusRejected, toolbus.CodeApprovalDenied, msg)
		d.res.Human = &toolbus.HumanDecision{Kind: toolbus.DecisionRejected, Who: dec.Who}
	case dec.Arguments == "":
		d.approved = &toolbus.HumanDecision{Kind: toolbus.DecisionApproved, Who: dec.Who}
	default:
		// The call runs with the person's arguments (the injector checked them against
		// the tool's schema before recording the decision; Execute checks them again).
		d.edit = &toolbus.HumanDecision{Kind: toolbus.DecisionEdited, Who: dec.Who, Arguments: dec.Arguments}
		d.req.Call.Arguments = dec.Arguments
	}
	return nil
}

// responded is the result of a call a person answered in the tool's place: the tool did
// not run, the answer is the result, and both the event (Human) and the text the model
// reads say so.
func responded(call toolbus.ToolCall, a toolbus.Approval) toolbus.ToolResult {
	out, _ := json.Marshal(a.Response) // a string always encodes
	return toolbus.ToolResult{CallID: call.CallID, Tool: call.Tool, Status: toolbus.StatusSucceeded, Output: out,
		Content: fmt.Sprintf("[answered by a person (%s) in place of the tool, which did not run]\n%s", a.Who, a.Response),
		Human:   &toolbus.HumanDecision{Kind: toolbus.DecisionResponded, Who: a.Who}}
}

// editNoteMax bounds the edited arguments quoted in the note the model reads.
const editNoteMax = 512

// markEdited marks the result of a call that ran with a person's arguments, in the event
// and in the text the model reads (the model's own call still shows its arguments).
func markEdited(res *toolbus.ToolResult, e *toolbus.HumanDecision) {
	res.Human = e
	args := e.Arguments
	if len(args) > editNoteMax {
		args = args[:editNoteMax] + "…"
	}
	res.Content = fmt.Sprintf("[a person (%s) edited the arguments of this call; it ran with %s]\n%s", e.Who, args, res.Content)
}

// execute runs the tool, unless an earlier stage already set the call's result.
func (w *Worker) execute(ctx context.Context, d *delivery) error {
	if d.res.Status != "" {
		return nil
	}
	d.ran = true
	w.cfg.Metrics.CallStarted(d.req.Call.Tool)
	res, err := w.run(ctx, d.msg, d.req, d.rs, d.attempt(), d.lv)
	w.cfg.Metrics.CallStopped(d.req.Call.Tool)
	if err != nil {
		return err
	}
	d.res = res
	if d.edit != nil {
		markEdited(&d.res, d.edit)
	}
	if d.approved != nil {
		d.res.Human = d.approved
	}
	return nil
}

// publish stores the call's one result: its large output in the outputs bucket, then
// tool.finished on the call's queue. A result produced after the lease lapsed is never
// published (another executor may own the call by now).
func (w *Worker) publish(ctx context.Context, d *delivery) error {
	if !d.lv.valid() {
		return errLeaseLost
	}
	d.res.Attempt = d.attempt()
	d.res.Executor = w.cfg.Instance
	d.res.Retries = d.own.claim.Retries
	if until := d.lv.serverDeadline(); !until.IsZero() {
		until = until.UTC()
		d.res.LeaseUntil = &until
	}
	// The call ran: its result must not be lost to a bus hiccup (a redelivered call whose
	// result is not stored runs again), so storing it is retried in place.
	if err := w.retry(ctx, d.msg, d.log, "store the large output", func() error {
		return w.keepLargeOutput(ctx, d.queue, d.req, &d.res)
	}); err != nil {
		return err
	}
	err := w.retry(ctx, d.msg, d.log, "publish the result", func() error {
		if !d.lv.valid() {
			return errLeaseLost // each try checks: a late publication could follow a take-over
		}
		_, err := w.bus.PublishEvent(ctx, events.ToolFinishedEventOn(w.source, toolbus.ToolFinished{
			RunID: d.req.RunID, Step: d.req.Step, CallIndex: d.req.CallIndex, CallCount: d.req.CallCount, ToolResult: d.res}, d.queue).Traced(d.meta.TraceParent))
		return err
	})
	if err != nil {
		return err
	}
	d.published = true
	if w.bus.TeamAccount() && d.own.rev != 0 {
		// The take-over of a call must find that it is done without walking the
		// stream's results, which a team may not read.
		done := d.own
		done.claim.Done = true
		return w.markClaim(ctx, d.msg, d.queue, d.req, done, d.log, "mark the claim done")
	}
	return nil
}

// permissionDenied answers a call that the executor's credentials do not let it handle
// (see denied) instead of letting it time out on every delivery; and so a call a write
// of which the core's write service refused for good (400: its form, a roll-up, its
// size; events.WriteRefusedForGood), which no delivery of the call could make.
func (w *Worker) permissionDenied(next handlerFunc) handlerFunc {
	return func(ctx context.Context, d *delivery) error {
		err := next(ctx, d)
		if err == nil {
			return nil
		}
		if derr := w.bus.Denied(d.start, err); errors.Is(derr, connect.ErrPermissionDenied) {
			return w.denied(ctx, d, derr)
		}
		if !events.WriteRefusedForGood(err) {
			return err
		}
		if d.published {
			// The result is stored: only a later write (the claim's done mark) was
			// refused. The call is done; a take-over finds its result.
			d.log().Warn("write after the result refused by the core's write service", "error", err)
			return nil
		}
		return w.denied(ctx, d, err)
	}
}

// lastDelivery is the "last delivery → poison result" rule: the last execution a call
// is allowed (Config.MaxDeliver, counted by its claim) does not run the tool but reports
// tool_internal_error, so a call that keeps killing its executor still ends with exactly
// one result.
func (w *Worker) lastDelivery(next handlerFunc) handlerFunc {
	return func(ctx context.Context, d *delivery) error {
		// Attempts that failed and were retried by the tool's policy finished: only
		// the executions that died count.
		if a := d.attempt() - len(d.own.claim.Retries); d.res.Status == "" && a >= w.cfg.MaxDeliver && a > 1 {
			d.res = executor.ErrorResult(d.req.Call, toolbus.StatusFailed, toolbus.CodeToolInternalError,
				fmt.Sprintf("the call did not finish in %d attempts (its executor died each time); it was not run again", a-1))
		}
		return next(ctx, d)
	}
}

// traced makes the call's span (GenAI conventions, "execute_tool <tool>"), a child of
// the step's span carried in the tool.requested headers; the tool.finished carries it on.
func (w *Worker) traced(next handlerFunc) handlerFunc {
	return func(ctx context.Context, d *delivery) error {
		ctx, span := w.cfg.Tracer.Start(events.ExtractTrace(ctx, d.msg.Headers()), "execute_tool "+d.req.Call.Tool,
			trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
				attribute.String("gen_ai.operation.name", "execute_tool"),
				attribute.String("gen_ai.tool.name", d.req.Call.Tool),
				attribute.String("gen_ai.tool.call.id", d.req.Call.CallID),
				attribute.String("toolbus.run_id", d.req.RunID),
				attribute.Int("toolbus.step", d.req.Step),
				attribute.Int("toolbus.attempt", d.attempt()),
			))
		defer func() {
			if d.res.Status != "" {
				span.SetAttributes(attribute.String("toolbus.tool.status", string(d.res.Status)))
				if d.res.Status != toolbus.StatusSucceeded {
					span.SetAttributes(attribute.String("error.type", d.res.Code()))
					span.SetStatus(codes.Error, d.res.Code())
				}
			}
			span.End()
		}()
		return next(ctx, d)
	}
}

// counted records each published result once (Metrics.CallFinished).
func (w *Worker) counted(next handlerFunc) handlerFunc {
	return func(ctx context.Context, d *delivery) error {
		err := next(ctx, d)
		if err != nil || !d.published {
			return err
		}
		tool := d.req.Call.Tool
		if !w.serves(tool) {
			tool = events.UnknownToolToken // the model names tools: keep the label set bounded
		}
		w.cfg.Metrics.CallFinished(tool, string(d.res.Status), d.res.Code(), time.Duration(d.res.DurationMS)*time.Millisecond, d.ran)
		return nil
	}
}

// logged writes one line per published result, at debug: at info it cost a few percent
// of a call's CPU at load (the stream already records every call for audit).
func (w *Worker) logged(next handlerFunc) handlerFunc {
	return func(ctx context.Context, d *delivery) error {
		err := next(ctx, d)
		if err == nil && d.published && w.log.Enabled(ctx, slog.LevelDebug) {
			d.log().Debug("call finished", "status", d.res.Status, "code", d.res.Code(), "duration_ms", d.res.DurationMS, "attempt", d.attempt())
		}
		return err
	}
}

// denied ends a call that the executor's credentials do not let it handle, or a write
// of which the core's write service refused for good: it publishes a failed result
// whose code (permission_denied) and message name the missing permission or the
// refusal, at once, instead of the call timing out on every delivery (or running again
// on each). If even that publish is refused the message is terminated with the reason:
// nothing this executor can do for the call will work until its permissions (or the
// write service) change (the run's deadline then ends the call).
func (w *Worker) denied(ctx context.Context, d *delivery, err error) error {
	req := d.req
	// The error paths are logged once, by the consume loop that terminates the message;
	// only the call ended with a result is logged here.
	if !d.decoded || d.meta.Type != events.TypeToolRequested || req.RunID == "" {
		return fmt.Errorf("%w: %w", events.ErrPoison, err)
	}
	res := executor.ErrorResult(req.Call, toolbus.StatusFailed, toolbus.CodePermissionDenied,
		"the executor could not handle this call: "+err.Error())
	res.Executor = w.cfg.Instance
	start := time.Now()
	_, perr := w.bus.PublishEvent(ctx, events.ToolFinishedEvent(w.source, toolbus.ToolFinished{
		RunID: req.RunID, Step: req.Step, CallIndex: req.CallIndex, CallCount: req.CallCount, ToolResult: res}).Traced(d.meta.TraceParent))
	if perr != nil {
		return fmt.Errorf("%w: %w (and its result could not be published: %w)", events.ErrPoison, err, w.bus.Denied(start, perr))
	}
	if events.WriteRefusedForGood(err) {
		d.log().Error("call ended: the core's write service refused a write of it", "error", err)
	} else {
		d.log().Error("call ended: the executor's credentials miss a permission", "error", err)
	}
	w.cfg.Metrics.CallFinished(req.Call.Tool, string(res.Status), res.Code(), 0, false)
	return nil
}

// handBack gives up an attempt whose lease ran out before its result was stored: the
// claim is marked abandoned and the call redelivered (to any executor) after a delay.
func (w *Worker) handBack(ctx context.Context, d *delivery) error {
	if err := w.abandon(ctx, d.msg, d.queue, d.req, d.own, d.log); err != nil {
		return err
	}
	return &consume.DeferError{Delay: max(w.beatEvery(), time.Second), Reason: errLeaseLost.Error()}
}
