package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sourcegraph/conc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// Config configures a planner worker. Zero fields take their defaults; New refuses
// negative ones (Validate).
type Config struct {
	// WorkerConfig: Instance (default "planner"), Concurrency (steps planned at once),
	// AckWait (before the step of a dead planner is redelivered; a live planner sends
	// heartbeats during long model calls), MaxDeliver (bounds retries of a step whose
	// model call keeps failing), Grace, Logger.
	workerconfig.WorkerConfig
	// Durable is the consumer name shared by all planners (default "planner").
	Durable string
	// ModelTimeout bounds one model call (default DefaultModelTimeout).
	ModelTimeout time.Duration
	// Defaults are the limits of runs that set none (deadline, token budget).
	Defaults toolbus.DefaultLimits
	// MaxCallsPerStep caps the calls of one step that are executed (default
	// DefaultMaxCallsPerStep): each call beyond it gets a rejected result (code
	// too_many_calls) from the planner itself.
	MaxCallsPerStep int
	// MaxAnswerBytes bounds a model answer (the model.responded data as JSON): a larger
	// one ends the run failed with code model_answer_too_large, without asking the model
	// again. 0, or more than the server accepts in one message (its max_payload, 1 MiB
	// by default) less AnswerHeadroom, means that bound: a larger answer could not be
	// recorded, and the step would be retried, the model paid each time.
	MaxAnswerBytes int
	// Metrics, when set, records model calls and the runs this planner ends.
	Metrics Metrics
	// Observer, when set, watches the consume loop (readiness, redeliveries, poison).
	Observer consume.Observer
	// Tracer makes the span of each step's model call (default: the global provider's,
	// a no-op unless tracing is configured).
	Tracer trace.Tracer
	// Models, when set, serves the runs that name a model (RunStarted.Model): it returns
	// the Model for that name, or an error when this planner cannot serve it, which
	// fails the run with code model_error and the error as its reason. Runs that name no
	// model get the planner's own. When nil, every run gets the planner's own model,
	// whatever it names.
	Models func(name string) (Model, error)
}

// Metrics records what a planner does. It is an interface so that this package does not
// depend on a metrics library; implementations must be safe for concurrent use.
type Metrics interface {
	// ModelCalled is called after each model call with its latency, its token usage and
	// its error (nil on success).
	ModelCalled(model string, d time.Duration, u toolbus.Usage, err error)
	// RunEnded is called when this planner ends a run (an answer, a budget, a failure).
	RunEnded(outcome, code string)
}

type nopMetrics struct{}

func (nopMetrics) ModelCalled(string, time.Duration, toolbus.Usage, error) {}
func (nopMetrics) RunEnded(string, string)                                 {}

// Defaults of Config (the shared ones are events.DefaultConcurrency and its siblings).
const (
	// AnswerHeadroom is what a recorded answer leaves of the server's max_payload for
	// the message's headers and envelope.
	AnswerHeadroom = 16 << 10
	// DefaultMaxCallsPerStep is the default of Config.MaxCallsPerStep.
	DefaultMaxCallsPerStep = 128
	// DefaultModelTimeout is the default of Config.ModelTimeout.
	DefaultModelTimeout = 2 * time.Minute
	// busWriteTimeout bounds the bus writes of a step after its model call.
	busWriteTimeout = 10 * time.Second
)

// Validate reports the first field out of range (an *workerconfig.ConfigError wrapping
// workerconfig.ErrInvalidConfig); zero values are valid.
func (c Config) Validate() error {
	if err := c.WorkerConfig.Validate(); err != nil {
		return fmt.Errorf("planner: %w", err)
	}
	switch {
	case c.ModelTimeout < 0:
		return fmt.Errorf("planner: %w", workerconfig.InvalidField("ModelTimeout", c.ModelTimeout,
			fmt.Sprintf("more than 0s (0: default %v)", DefaultModelTimeout)))
	case c.MaxCallsPerStep < 0:
		return fmt.Errorf("planner: %w", workerconfig.InvalidField("MaxCallsPerStep", c.MaxCallsPerStep,
			fmt.Sprintf("1 or more (0: default %d)", DefaultMaxCallsPerStep)))
	case c.MaxAnswerBytes < 0:
		return fmt.Errorf("planner: %w", workerconfig.InvalidField("MaxAnswerBytes", c.MaxAnswerBytes,
			"1 or more (0: what the server accepts)"))
	}
	return nil
}

func (c *Config) setDefaults() {
	c.WorkerConfig = c.WorkerConfig.WithDefaults("planner")
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	if c.Tracer == nil {
		c.Tracer = otel.Tracer("github.com/toolbus/toolbus/planner")
	}
	if c.Durable == "" {
		c.Durable = "planner"
	}
	if c.ModelTimeout == 0 {
		c.ModelTimeout = DefaultModelTimeout
	}
	if c.MaxCallsPerStep == 0 {
		c.MaxCallsPerStep = DefaultMaxCallsPerStep
	}
}

// Planner is the planner worker.
type Planner struct {
	cfg     Config
	bus     *events.Bus
	model   Model
	catalog *store.Catalog
	source  string
	log     *slog.Logger

	mu        sync.Mutex
	cache     map[string]*runHistory
	cancelled map[string]struct{}
	// ends are the runs known to have ended, from their outcome events and their run
	// states' writes: a step is planned without reading its run's state when they answer
	// for the run (runState)
	ends *follow.RunOutcomes
}

// New returns a planner that calls model and offers the tools of catalog, or the error
// of cfg.Validate.
func New(bus *events.Bus, model Model, catalog *store.Catalog, cfg Config) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	var ends *follow.RunOutcomes
	if bus != nil {
		ends = follow.Outcomes(bus)
		ends.FollowRunStates()
	}
	return &Planner{
		cfg: cfg, bus: bus, model: model, catalog: catalog,
		source: events.Source("planner", cfg.Instance),
		log:    cfg.Logger.With("component", "planner", "instance", cfg.Instance),
		cache:  map[string]*runHistory{}, cancelled: map[string]struct{}{}, ends: ends,
	}, nil
}

// Run consumes model.requested until ctx ends, then drains.
func (p *Planner) Run(ctx context.Context) error {
	wc := provision.WorkerConsumers(provision.RolePlanner, provision.WorkerSettings{
		Durable: p.cfg.Durable, AckWait: p.cfg.AckWait, MaxDeliver: p.cfg.MaxDeliver, Concurrency: p.cfg.Concurrency,
	})[0]
	cons, err := provision.Consumer(ctx, p.bus, wc.ConsumerConfig)
	if err != nil {
		return err
	}
	// A local view of cancellations spares a run-state read per step; redeliveries
	// still read the run state.
	sub, err := p.bus.Conn().Subscribe(events.FilterRunCancel, func(m *nats.Msg) {
		if run, ok := events.CancelOf(m); ok {
			p.mu.Lock()
			if len(p.cancelled) > 100000 {
				clear(p.cancelled)
			}
			p.cancelled[run] = struct{}{}
			delete(p.cache, run)
			p.mu.Unlock()
		}
	})
	if err != nil {
		return fmt.Errorf("planner: subscribe to cancellations: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // the connection may be closing
	if err := p.ends.Listen(ctx); err != nil {
		// Without them every step reads its run's state, as it always may.
		p.log.Warn("run ends not followed: each step reads its run's state", "error", err)
	}
	defer p.ends.Close()
	p.log.Info("planner serving", "consumer", p.cfg.Durable, "concurrency", p.cfg.Concurrency,
		"stream", p.bus.Config().Stream, "nats", p.bus.Conn().ConnectedUrlRedacted())
	err = consume.Serve(ctx, cons, consume.Config{
		Concurrency: p.cfg.Concurrency, Grace: p.cfg.Grace, Logger: p.log, NakDelay: 2 * time.Second,
		Observer: p.cfg.Observer,
	}, p.handle)
	p.log.Info("planner stopped", "error", err)
	return err
}

func (p *Planner) ended(run string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.cancelled[run]
	return ok
}

func (p *Planner) handle(ctx context.Context, msg jetstream.Msg) error {
	start := time.Now()
	var req toolbus.ModelRequested
	meta, err := events.DecodeMsg(msg, &req)
	if err != nil {
		return err
	}
	if meta.Type != events.TypeModelRequested || !toolbus.ValidRunID(req.RunID) || req.Step < 0 {
		return fmt.Errorf("%w: unexpected %s event for run %q step %d", events.ErrPoison, meta.Type, req.RunID, req.Step)
	}
	if err := events.CheckSubject(msg.Subject(), meta, &req); err != nil {
		return err
	}
	// first: the request's first delivery, the only one that may be planned without
	// reading the step's view (viewless).
	delivered, first := uint64(1), false
	if md, err := msg.Metadata(); err == nil {
		delivered, first = md.NumDelivered, md.NumDelivered == 1
	}
	// A model call can outlast AckWait: heartbeats keep the step with this planner while
	// it lives, and a dead planner's step is redelivered after one AckWait.
	stopBeat := consume.Heartbeat(msg, p.cfg.AckWait/3)
	defer stopBeat()
	// The heartbeats must not keep a step forever: the whole step is bounded.
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ModelTimeout+p.cfg.AckWait)
	defer cancel()
	err = p.plan(ctx, req, first, meta.TraceParent)
	if derr := p.bus.Denied(start, err); errors.Is(derr, connect.ErrPermissionDenied) {
		// The planner's credentials miss a permission: no redelivery can help, so the run
		// ends now with a code and a reason naming it, instead of stalling until its
		// deadline.
		p.log.Error("step failed: the planner's credentials miss a permission; the run ends", "run_id", req.RunID, "step", req.Step, "error", derr)
		if ferr := p.fail(ctx, req.RunID, req.Step, toolbus.CodePermissionDenied,
			fmt.Sprintf("the planner could not plan step %d: %v", req.Step, derr)); ferr != nil {
			return fmt.Errorf("%w: %w (and the run could not be ended: %w)", events.ErrPoison, derr, p.bus.Denied(start, ferr))
		}
		return nil
	}
	if err != nil && !errors.Is(err, events.ErrPoison) && !errors.Is(err, events.ErrRunEnded) &&
		delivered >= uint64(p.cfg.MaxDeliver) {
		// Last delivery: end the run rather than leave it hanging.
		p.log.Error("step failed on its last delivery", "run_id", req.RunID, "step", req.Step, "error", err)
		return p.fail(ctx, req.RunID, req.Step, toolbus.CodeModelError, err.Error())
	}
	if errors.Is(err, events.ErrRunEnded) {
		return nil
	}
	return err
}

// Step plans one step of a run. It is idempotent: a step already answered is
// republished as recorded (the stream drops the duplicates), without a model call.
func (p *Planner) Step(ctx context.Context, run string, step int, traceparent string) error {
	return p.plan(ctx, toolbus.ModelRequested{RunID: run, Step: step}, false, traceparent)
}

// plan plans the step req asks for; first reports that req is on its first delivery.
func (p *Planner) plan(ctx context.Context, req toolbus.ModelRequested, first bool, traceparent string) error {
	run, step := req.RunID, req.Step
	rs, startSeq, err := p.bus.RunStartedAt(ctx, run)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return fmt.Errorf("%w: %w", events.ErrPoison, err)
		}
		return err
	}
	rs = rs.WithDefaults(p.cfg.Defaults)
	if p.ended(run) {
		p.log.Info("run cancelled, step skipped", "run_id", run, "step", step)
		p.forget(run)
		return nil
	}
	// Only a running run's current step is planned: a forged or duplicate request for
	// another step, or for an ended run, is terminated with the reason and calls no model.
	// The run state (runState) and the step's view (current) are read at once: two round
	// trips in parallel, not one after the other. The view is not read at all when the
	// request itself vouches for it (viewless); the run's state is always established
	// (read, or known from the followed run ends): it is what refuses a step of a run
	// whose end was recorded but whose outcome event a crash lost.
	var (
		viewed   conc.WaitGroup
		view     stepView
		recorded *toolbus.ModelResponded
		viewErr  error
	)
	if carried, ok := p.viewless(req, first); ok {
		view = stepView{carried: carried, skipped: true}
	} else {
		viewed.Go(func() { view.prev, recorded, viewErr = p.current(ctx, run, step) })
	}
	st, err := p.runState(ctx, run, startSeq)
	viewed.Wait()
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return fmt.Errorf("%w: step %d of run %s, which has no run state", events.ErrPoison, step, run)
		}
		return err
	}
	if st.Status.Terminal() {
		return p.stepOfEndedRun(ctx, run, step, st)
	}
	if viewErr != nil {
		return viewErr
	}
	if !rs.Limits.Deadline.IsZero() && time.Now().After(rs.Limits.Deadline) {
		return p.end(ctx, run, step, toolbus.RunEnded{RunID: run, Status: toolbus.RunLimitReached,
			Code: toolbus.LimitDeadline, Reason: "run deadline passed before step " + strconv.Itoa(step), StepsUsed: step})
	}

	ctx, span := p.stepSpan(ctx, rs, step, traceparent)
	defer span.End()
	mr, got, err := p.answer(ctx, span, rs, step, view, recorded)
	if errors.Is(err, errEndedHere) {
		return nil // the run ended with the step's failure (model_error...): nothing to publish
	}
	if err != nil {
		return err
	}
	p.rememberAssistant(rs, step, mr)
	// Past the model call every operation is a bus write of milliseconds: bound them, so
	// that one the server refuses (a missing permission, which the server only drops)
	// fails in seconds and ends the run rather than holding the step for its whole budget.
	ctx, cancelWrites := context.WithTimeout(ctx, busWriteTimeout)
	defer cancelWrites()
	span.SetAttributes(
		attribute.String("gen_ai.response.model", mr.Model),
		attribute.Int64("gen_ai.usage.input_tokens", mr.Usage.InputTokens),
		attribute.Int64("gen_ai.usage.output_tokens", mr.Usage.OutputTokens),
		attribute.Int("toolbus.tool_calls", len(mr.Message.ToolCalls)),
		attribute.Bool("toolbus.model_reused", got),
	)

	return p.publishResponse(ctx, rs, step, mr, traceparent)
}

// runState returns what planning a step needs of its run's state. While the followed
// ends (outcome events and run-state writes, RunOutcomes.FollowRunStates) answer for the
// run and know no end, the run is running and nothing is read; otherwise the state is
// read. Either way an end recorded before the step is seen: the followed writes include
// the one that records it, even when the crash of its writer lost the outcome event.
func (p *Planner) runState(ctx context.Context, run string, startSeq uint64) (store.RunState, error) {
	if p.ends != nil {
		if status, ok := p.ends.Lookup(run, startSeq); ok && status == "" {
			return store.RunState{RunID: run, Status: toolbus.RunRunning}, nil
		}
	}
	st, _, err := p.bus.Store().RunState(ctx, run)
	return st, err
}

// errEndedHere: answer ended the run itself (p.fail) and the step has nothing to publish.
var errEndedHere = errors.New("planner: the step ended its run")

// endedHere is answer's error once it ended the run: the error of ending it, if any.
func endedHere(err error) error {
	if err != nil {
		return err
	}
	return errEndedHere
}

// answer returns the step's assistant message, recorded: the one already recorded (a
// redelivery or a duplicate request: the model is called once per step), the
// pre-planned calls of a run that has them, or the model's answer. got reports that
// the model was not called. errEndedHere: it ended the run (p.fail, answerTooLarge).
func (p *Planner) answer(ctx context.Context, span trace.Span, rs *toolbus.RunStarted, step int, view stepView, recorded *toolbus.ModelResponded) (mr toolbus.ModelResponded, got bool, err error) {
	run := rs.RunID
	// Reuse what the model already said for this step, if it was recorded (a redelivery,
	// or a duplicate request): the model is called once per step.
	if recorded != nil {
		mr, got = *recorded, true
	}
	if !got && len(rs.Calls) > 0 {
		// A pre-planned run: its calls are step 0, and no model is ever called.
		mr = prePlanned(rs, step)
		wctx, cancel := context.WithTimeout(ctx, busWriteTimeout)
		mr, _, err = p.bus.Store().PutAssistant(wctx, mr)
		cancel()
		if err != nil {
			return mr, got, err
		}
		got = true
	}
	if !got {
		if mr, err = p.callModel(ctx, rs, step, view); err != nil {
			if rec, ok := p.recordedAfterAll(ctx, view, run, step); ok {
				return rec, true, nil
			}
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.String("error.type", toolbus.CodeModelError))
			if errors.Is(err, ErrPermanent) {
				return mr, got, endedHere(p.fail(ctx, run, step, toolbus.CodeModelError, err.Error()))
			}
			return mr, got, err
		}
		// An answer the bus cannot record would fail every retry of the step, each
		// retry paying the model again: the run ends now.
		if limit := p.maxAnswer(); limit > 0 {
			if b, merr := json.Marshal(mr); merr == nil && len(b) > limit {
				if rec, ok := p.recordedAfterAll(ctx, view, run, step); ok {
					return rec, true, nil
				}
				return mr, got, endedHere(p.answerTooLarge(ctx, run, step, len(b), limit))
			}
		}
		// The first recorded answer wins (another planner may have raced us).
		wctx, cancel := context.WithTimeout(ctx, busWriteTimeout)
		mr, _, err = p.bus.Store().PutAssistant(wctx, mr)
		cancel()
		if err != nil {
			if tooLarge(err) {
				return mr, got, endedHere(p.answerTooLarge(ctx, run, step, 0, p.maxAnswer()))
			}
			return mr, got, err
		}
	}
	return mr, got, nil
}

// recordedAfterAll returns the answer recorded for step when the view was not read
// (viewless) and the model call failed or its answer cannot be recorded: the request may
// have been a duplicate of an answered step, whose recorded answer stands, so a failure
// of the extra model call must not end the run or hold the step.
func (p *Planner) recordedAfterAll(ctx context.Context, view stepView, run string, step int) (toolbus.ModelResponded, bool) {
	if !view.skipped {
		return toolbus.ModelResponded{}, false
	}
	mr, err := p.bus.Store().Assistant(ctx, run, step)
	return mr, err == nil
}

// stepOfEndedRun refuses a step of a run that ended (a poison error). If the run's end
// was recorded but its outcome lost in a crash, it publishes the outcome now (best
// effort: the injectors and the deadline timer also do).
func (p *Planner) stepOfEndedRun(ctx context.Context, run string, step int, st store.RunState) error {
	p.forget(run)
	if err := p.bus.PublishOutcome(ctx, p.source, st); err != nil {
		p.log.Warn("could not republish the outcome of an ended run", "run_id", run, "status", st.Status, "error", err)
	}
	return fmt.Errorf("%w: step %d of run %s, which ended %s", events.ErrPoison, step, run, st.Status)
}

// stepSpan starts the step's span: one per step of the run's trace (GenAI conventions,
// "chat <model>"); the tool.requested events carry it to the executors' spans.
func (p *Planner) stepSpan(ctx context.Context, rs *toolbus.RunStarted, step int, traceparent string) (context.Context, trace.Span) {
	return p.cfg.Tracer.Start(trace.ContextWithRemoteSpanContext(ctx, events.RunTraceContext(rs.RunID, traceparent)),
		"chat "+rs.Model, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			attribute.String("gen_ai.request.model", rs.Model),
			attribute.String("gen_ai.conversation.id", rs.RunID),
			attribute.String("toolbus.run_id", rs.RunID),
			attribute.Int("toolbus.step", step),
		))
}

// publishResponse publishes the step's model.responded, then ends the run (token budget
// exceeded, or an answer with no tool calls) or requests its tool calls.
func (p *Planner) publishResponse(ctx context.Context, rs *toolbus.RunStarted, step int, mr toolbus.ModelResponded, traceparent string) error {
	run := rs.RunID
	responded, err := p.bus.PublishEventAsync(ctx, events.ModelRespondedEvent(p.source, mr).Traced(traceparent))
	if err != nil {
		return err
	}
	futures := []*events.PubFuture{responded}

	used, err := p.usage(ctx, run, step, mr.Usage)
	if err != nil {
		return err
	}
	if budget := rs.Limits.TokenBudget; budget > 0 && used.Total() > budget {
		if err := events.AwaitAcks(ctx, futures); err != nil {
			return err
		}
		p.forget(run)
		return p.end(ctx, run, step, toolbus.RunEnded{RunID: run, Status: toolbus.RunLimitReached,
			Code: toolbus.LimitTokenBudget, StepsUsed: step + 1, Usage: used,
			Reason: fmt.Sprintf("token budget %d exceeded: %d tokens used", budget, used.Total())})
	}

	calls := mr.Message.ToolCalls
	if len(calls) == 0 {
		if err := events.AwaitAcks(ctx, futures); err != nil {
			return err
		}
		p.forget(run)
		return p.end(ctx, run, step, toolbus.RunEnded{RunID: run, Status: toolbus.RunCompleted,
			Answer: mr.Message.Content, StepsUsed: step + 1, Usage: used})
	}
	return p.publishCalls(ctx, rs, step, calls, traceparent, futures)
}

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

// publishCalls publishes one tool.requested per call, up to the per-step cap; each call
// beyond the cap gets a rejected result (too_many_calls) published here, so the step
// still has one result per call and the model reads why.
func (p *Planner) publishCalls(ctx context.Context, rs *toolbus.RunStarted, step int, calls []toolbus.ToolCall, traceparent string, futures []*events.PubFuture) error {
	for i, c := range calls {
		if i >= p.cfg.MaxCallsPerStep {
			f, err := p.rejectExcess(ctx, rs.RunID, step, i, calls, traceparent)
			if err != nil {
				return err
			}
			futures = append(futures, f)
			continue
		}
		_, served := p.catalog.Resolve(ctx, c.Tool)
		f, err := p.bus.PublishEventAsync(ctx, events.ToolRequestedEvent(p.source, toolbus.ToolRequested{
			RunID: rs.RunID, Step: step, CallIndex: i, CallCount: len(calls), Call: c,
			Deadline: rs.Limits.Deadline, Principal: rs.Principal, AllowedTools: rs.AllowedTools,
		}, served).Traced(traceparent))
		if err != nil {
			return err
		}
		futures = append(futures, f)
		if !served {
			// No executor serves it: the call is recorded on tool.requested._unknown,
			// which nobody consumes, and answered here, so it still gets exactly one
			// result and no executor credentials need a result subject shared by
			// every team (where one team could answer another team's calls).
			if f, err = p.rejectUnserved(ctx, rs.RunID, step, i, calls, traceparent); err != nil {
				return err
			}
			futures = append(futures, f)
		}
	}
	return events.AwaitAcks(ctx, futures)
}

// rejectUnserved publishes the rejected result (unknown_tool) of call i, whose tool no
// executor serves: on the tool's own result subject (tool.finished._unknown for a name
// that is not a valid tool name).
func (p *Planner) rejectUnserved(ctx context.Context, run string, step, i int, calls []toolbus.ToolCall, traceparent string) (*events.PubFuture, error) {
	c := calls[i]
	name := c.Tool
	if len(name) > 100 { // the model names tools: keep the message bounded
		name = name[:100] + "..."
	}
	terr := toolbus.ToolError{Code: toolbus.CodeUnknownTool, Message: fmt.Sprintf("no executor serves a tool named %q", name)}
	content, err := json.Marshal(map[string]toolbus.ToolError{"error": terr})
	if err != nil {
		return nil, fmt.Errorf("planner: unknown tool result: %w", err)
	}
	res := toolbus.ToolResult{CallID: c.CallID, Tool: c.Tool, Status: toolbus.StatusRejected, Content: string(content),
		Executor: p.source, Attempt: 1, Error: &terr}
	return p.bus.PublishEventAsync(ctx, events.ToolFinishedEvent(p.source,
		toolbus.ToolFinished{RunID: run, Step: step, CallIndex: i, CallCount: len(calls), ToolResult: res}).Traced(traceparent))
}

// rejectExcess publishes the rejected result of call i, beyond the per-step cap.
func (p *Planner) rejectExcess(ctx context.Context, run string, step, i int, calls []toolbus.ToolCall, traceparent string) (*events.PubFuture, error) {
	c := calls[i]
	msg := fmt.Sprintf("not run: this step asked for %d tool calls and at most %d run per step; ask for the rest in a later step",
		len(calls), p.cfg.MaxCallsPerStep)
	res := toolbus.ToolResult{CallID: c.CallID, Tool: c.Tool, Status: toolbus.StatusRejected, Content: msg, Executor: p.source,
		Error: &toolbus.ToolError{Code: toolbus.CodeTooManyCalls, Message: msg, Retryable: true}}
	return p.bus.PublishEventAsync(ctx, events.ToolFinishedEvent(p.source,
		toolbus.ToolFinished{RunID: run, Step: step, CallIndex: i, CallCount: len(calls), ToolResult: res}).Traced(traceparent))
}

func (p *Planner) callModel(ctx context.Context, rs *toolbus.RunStarted, step int, view stepView) (toolbus.ModelResponded, error) {
	msgs, err := p.history(ctx, rs.RunID, step, view)
	if err != nil {
		return toolbus.ModelResponded{}, err
	}
	msgs = p.attachmentBytes(ctx, rs, msgs)
	mctx, cancel := context.WithTimeout(ctx, p.cfg.ModelTimeout)
	defer cancel()
	if !rs.Limits.Deadline.IsZero() {
		var c2 context.CancelFunc
		mctx, c2 = context.WithDeadline(mctx, rs.Limits.Deadline)
		defer c2()
	}
	model := p.model
	if rs.Model != "" && p.cfg.Models != nil {
		if model, err = p.cfg.Models(rs.Model); err != nil {
			// Retrying cannot help: the planner is configured as it is.
			return toolbus.ModelResponded{}, Permanent(fmt.Errorf("planner: run %s names model %q, which this planner cannot serve: %w", rs.RunID, rs.Model, err))
		}
	}
	start := time.Now()
	resp, err := model.Complete(mctx, Request{
		RunID: rs.RunID, Step: step, Model: rs.Model, Messages: msgs, Tools: p.catalog.Tools(rs),
	})
	// Labelled by the run's model, not the response's: the run's is the configured name
	// (a bounded set) and is known when the call fails.
	p.cfg.Metrics.ModelCalled(rs.Model, time.Since(start), resp.Usage, err)
	if err != nil {
		return toolbus.ModelResponded{}, fmt.Errorf("planner: model call for %s step %d: %w", rs.RunID, step, err)
	}
	resp.Message.Role = toolbus.RoleAssistant
	resp.Message.ToolCalls = NormalizeCallIDs(step, resp.Message.ToolCalls)
	return toolbus.ModelResponded{
		RunID: rs.RunID, Step: step, Message: resp.Message, Usage: resp.Usage,
		Model: resp.Model, LatencyMS: time.Since(start).Milliseconds(),
	}, nil
}

// MaxModelAttachmentBytes bounds the bytes of the attachments kept by reference that
// the planner reads for one model request; past it, and for one it cannot read, the
// adapter gets no bytes and describes the attachment.
const MaxModelAttachmentBytes = 32 << 20

// attachmentBytes returns msgs with the bytes of the attachments kept in the outputs
// bucket (Ref, no Data) read from there, within MaxModelAttachmentBytes; msgs itself
// is not changed (the history is cached). A reference is read only as its call's own
// (store.CallOutput): each step's messages are its assistant message, then its tool
// messages, so a tool message's step is the count of assistant messages after the
// run's own messages; a reference in the run's own messages (the client's) is never
// read.
func (p *Planner) attachmentBytes(ctx context.Context, rs *toolbus.RunStarted, msgs []toolbus.Message) []toolbus.Message {
	budget := MaxModelAttachmentBytes
	var out []toolbus.Message
	step := -1
	for i, m := range msgs {
		if i < len(rs.Messages) {
			continue
		}
		if m.Role == toolbus.RoleAssistant {
			step++
		}
		cloned := false
		for j, a := range m.Attachments {
			if a.Ref == "" || len(a.Data) > 0 || a.Size > budget || m.Role != toolbus.RoleTool {
				continue
			}
			owner := store.OutputOwner{Tool: m.Name, Run: rs.RunID, Step: step, CallID: m.ToolCallID}
			data, err := p.bus.Store().CallOutput(ctx, owner, a.Ref, j)
			if err != nil {
				p.log.Warn("attachment not read for the model: it is described instead", "run_id", rs.RunID, "ref", a.Ref, "error", err)
				continue
			}
			budget -= len(data)
			if out == nil {
				out = slices.Clone(msgs)
			}
			if !cloned {
				out[i].Attachments, cloned = slices.Clone(m.Attachments), true
			}
			out[i].Attachments[j].Data = data
		}
	}
	if out == nil {
		return msgs
	}
	return out
}

// prePlannedModel names the "model" of the steps of a pre-planned run.
const prePlannedModel = "toolbus/pre-planned"

// prePlanned returns the assistant message of a step of a pre-planned run (one with
// RunStarted.Calls): step 0 asks for the run's calls; any later step answers with no
// call, which ends the run completed.
func prePlanned(rs *toolbus.RunStarted, step int) toolbus.ModelResponded {
	msg := toolbus.Message{Role: toolbus.RoleAssistant}
	if step == 0 {
		msg.ToolCalls = NormalizeCallIDs(0, append([]toolbus.ToolCall(nil), rs.Calls...))
	} else {
		msg.Content = fmt.Sprintf("pre-planned run: %d call(s) answered", len(rs.Calls))
	}
	return toolbus.ModelResponded{RunID: rs.RunID, Step: step, Message: msg, Model: prePlannedModel}
}

// NormalizeCallIDs gives every call of a step a non-empty id unique within the step,
// keeping the provider's ids where they are already usable. Generated ids are stable
// (derived from step and index) so a retried step produces the same ones.
func NormalizeCallIDs(step int, calls []toolbus.ToolCall) []toolbus.ToolCall {
	seen := make(map[string]bool, len(calls))
	for i := range calls {
		id := calls[i].CallID
		if id == "" || seen[id] || len(id) > 200 {
			base := "call_" + strconv.Itoa(step) + "_" + strconv.Itoa(i)
			id = base
			for n := 1; seen[id]; n++ {
				id = base + "_" + strconv.Itoa(n)
			}
			calls[i].CallID = id
		}
		seen[id] = true
	}
	return calls
}

// maxAnswer is the largest model answer (JSON bytes) the planner records: the server's
// max_payload less AnswerHeadroom, or Config.MaxAnswerBytes when smaller; 0 when
// neither is known.
func (p *Planner) maxAnswer() int {
	limit := int(p.bus.Conn().MaxPayload()) - AnswerHeadroom
	if p.cfg.MaxAnswerBytes > 0 && (limit <= 0 || p.cfg.MaxAnswerBytes < limit) {
		limit = p.cfg.MaxAnswerBytes
	}
	return max(limit, 0)
}

// answerTooLarge ends a run whose model answer cannot be recorded (size 0: the store
// refused it).
func (p *Planner) answerTooLarge(ctx context.Context, run string, step, size, limit int) error {
	what := "is larger than"
	if size > 0 {
		what = fmt.Sprintf("is %d bytes, over", size)
	}
	return p.fail(ctx, run, step, toolbus.CodeModelAnswerTooLarge,
		fmt.Sprintf("the model's answer at step %d %s the %d bytes the bus can record (TOOLBUS_MAX_ANSWER_BYTES); it is not asked again", step, what, limit))
}

// tooLarge reports whether a store error says the message exceeds what the server
// accepts.
func tooLarge(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum)
}

func (p *Planner) fail(ctx context.Context, run string, step int, code, reason string) error {
	p.forget(run)
	return p.end(ctx, run, step, toolbus.RunEnded{RunID: run, Status: toolbus.RunFailed, Code: code, Reason: reason, StepsUsed: step + 1})
}

func (p *Planner) end(ctx context.Context, run string, step int, ended toolbus.RunEnded) error {
	err := p.bus.EndRun(ctx, p.source, step, ended)
	if errors.Is(err, events.ErrRunEnded) {
		p.log.Info("run already ended", "run_id", run, "step", step, "wanted", ended.Status)
		return nil
	}
	if err == nil {
		p.cfg.Metrics.RunEnded(string(ended.Status), ended.Code)
		p.log.Info("run ended", "run_id", run, "step", step, "status", ended.Status, "code", ended.Code)
	}
	return err
}
