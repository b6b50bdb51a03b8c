package planner

import (
	"context"
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
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
)

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
	cancelled map[string][]string // the actors of each run's run.cancel events heard
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
		cache:  map[string]*runHistory{}, cancelled: map[string][]string{}, ends: ends,
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
	// still read the run state. Anyone may publish a run.cancel naming any run on their
	// own subject: its actor is kept, and only a cancel by the run's principal or an
	// approver skips a step (ended); any other is the injector's to decide.
	sub, err := p.bus.Conn().Subscribe(events.FilterRunCancel, func(m *nats.Msg) {
		if run, who, ok := events.CancelOf(m); ok {
			p.mu.Lock()
			if len(p.cancelled) > 100000 {
				clear(p.cancelled)
			}
			if len(p.cancelled[run]) < 16 {
				p.cancelled[run] = append(p.cancelled[run], who)
			}
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

// ended reports whether a run.cancel of rs's run by its principal or an approver was
// heard (the decision policy's rule: the injector applies it to every cancel).
func (p *Planner) ended(rs *toolbus.RunStarted) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.ContainsFunc(p.cancelled[rs.RunID], rs.NamesDecider)
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
	if p.ended(rs) {
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
