package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
)

// WorkerConfig configures an executor worker.
type WorkerConfig struct {
	// Instance names this process in results, event sources and logs.
	Instance string
	// Concurrency is the most calls this worker runs at once (default 64).
	Concurrency int
	// Tools limits this deployment to a subset of the registry (empty: every tool).
	// Deployments with different subsets get different consumers; subsets must not
	// overlap.
	Tools []string
	// Durable overrides the consumer name (default "executor", or "executor-<tools>").
	Durable string
	// AckWait before a call whose worker died is redelivered (default 30s); long calls
	// send InProgress heartbeats.
	AckWait time.Duration
	// MaxDeliver bounds deliveries of one call (default 5). The last delivery does not
	// run the tool: it reports tool_internal_error, so a call that keeps killing its
	// worker still ends with exactly one result.
	MaxDeliver int
	// MaxAckPending bounds calls in flight across all workers of the consumer (default 1000).
	MaxAckPending int
	// InlineOutputMax is the largest output kept in the event itself (default 256 KiB);
	// larger outputs go to the object store and the result carries a reference.
	InlineOutputMax int
	// Grace for in-flight calls at shutdown before they are cancelled (default 30s).
	Grace  time.Duration
	Logger *slog.Logger
}

func (c *WorkerConfig) setDefaults() {
	if c.Instance == "" {
		c.Instance = "executor"
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.Durable == "" {
		c.Durable = "executor"
		if len(c.Tools) > 0 {
			t := append([]string(nil), c.Tools...)
			sort.Strings(t)
			c.Durable = "executor-" + strings.Join(t, "-")
			if len(c.Durable) > 200 {
				c.Durable = c.Durable[:200]
			}
		}
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = 5
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = 1000
	}
	if c.InlineOutputMax <= 0 {
		c.InlineOutputMax = 256 << 10
	}
	if c.Grace <= 0 {
		c.Grace = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Worker consumes tool.requested, runs each call through the Executor and publishes
// exactly one tool.finished per call, acknowledging the request only once the result is
// stored in the stream.
type Worker struct {
	cfg    WorkerConfig
	bus    *events.Bus
	exec   *Executor
	source string
	log    *slog.Logger

	mu        sync.Mutex
	inflight  map[string]map[*callHandle]struct{} // run id -> running calls
	cancelled map[string]time.Time                // runs cancelled recently
}

type callHandle struct{ cancel context.CancelCauseFunc }

// errRunCancelled is the cancellation cause of calls of a cancelled run.
var errRunCancelled = errors.New("executor: run cancelled")

// NewWorker returns a worker that runs calls with exec.
func NewWorker(bus *events.Bus, exec *Executor, cfg WorkerConfig) *Worker {
	cfg.setDefaults()
	return &Worker{cfg: cfg, bus: bus, exec: exec, source: events.Source("executor", cfg.Instance),
		log:      cfg.Logger.With("component", "executor", "instance", cfg.Instance),
		inflight: map[string]map[*callHandle]struct{}{}, cancelled: map[string]time.Time{}}
}

// Run publishes the served tools to the catalog, then consumes calls until ctx ends,
// then drains: intake stops, in-flight calls get the grace period, then are cancelled.
func (w *Worker) Run(ctx context.Context) error {
	served, err := w.served()
	if err != nil {
		return err
	}
	for _, name := range served {
		t, _ := w.exec.Registry().Lookup(name)
		if err := w.bus.PublishTool(ctx, t.Contract()); err != nil {
			return err
		}
	}
	sub, err := w.bus.NC.Subscribe(events.FilterRunCancel, w.onCancel)
	if err != nil {
		return fmt.Errorf("executor: subscribe to cancellations: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // connection may be closing
	filters := []string{events.FilterToolRequested}
	if len(w.cfg.Tools) > 0 {
		filters = []string{events.FilterToolRequestedFor(events.UnknownToolToken)}
		for _, t := range served {
			filters = append(filters, events.FilterToolRequestedFor(t))
		}
	}
	cons, err := w.bus.Consumer(ctx, events.ConsumerConfig{
		Durable: w.cfg.Durable, Filters: filters, AckWait: w.cfg.AckWait,
		MaxDeliver: w.cfg.MaxDeliver, MaxAckPending: w.cfg.MaxAckPending,
		BackOff: nil,
	})
	if err != nil {
		return err
	}
	w.log.Info("executor serving", "tools", served, "concurrency", w.cfg.Concurrency, "consumer", w.cfg.Durable)
	return events.Serve(ctx, cons, events.ServeConfig{
		Concurrency: w.cfg.Concurrency, Grace: w.cfg.Grace, Logger: w.log, NakDelay: time.Second,
		MaxWait: w.cfg.AckWait / 3,
	}, w.handle)
}

func (w *Worker) served() ([]string, error) {
	if len(w.cfg.Tools) == 0 {
		return w.exec.Registry().Names(), nil
	}
	for _, t := range w.cfg.Tools {
		if _, ok := w.exec.Registry().Lookup(t); !ok {
			return nil, fmt.Errorf("executor: tool %q of the deployment subset is not registered", t)
		}
	}
	return w.cfg.Tools, nil
}

func (w *Worker) onCancel(m *nats.Msg) {
	run, ok := events.RunIDFromSubject(m.Subject)
	if !ok {
		return
	}
	w.mu.Lock()
	if len(w.cancelled) > 100000 {
		clear(w.cancelled)
	}
	w.cancelled[run] = time.Now()
	n := 0
	for h := range w.inflight[run] {
		h.cancel(errRunCancelled)
		n++
	}
	w.mu.Unlock()
	w.log.Info("run cancelled", "run_id", run, "calls_cancelled", n)
}

func (w *Worker) track(run string, h *callHandle) (untrack func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, done := w.cancelled[run]; done {
		h.cancel(errRunCancelled)
	}
	m := w.inflight[run]
	if m == nil {
		m = map[*callHandle]struct{}{}
		w.inflight[run] = m
	}
	m[h] = struct{}{}
	return func() {
		w.mu.Lock()
		delete(m, h)
		if len(m) == 0 {
			delete(w.inflight, run)
		}
		w.mu.Unlock()
	}
}

func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) error {
	var req events.ToolRequested
	meta, err := events.DecodeMsg(msg, &req)
	if err != nil {
		return err
	}
	if meta.Type != events.TypeToolRequested || !events.ValidRunID(req.RunID) || req.Step < 0 ||
		req.CallCount <= 0 || req.CallIndex < 0 || req.CallIndex >= req.CallCount {
		return fmt.Errorf("%w: bad tool.requested %s (run %q, index %d of %d)", events.ErrPoison, meta.ID, req.RunID, req.CallIndex, req.CallCount)
	}
	attempt := 1
	if md, err := msg.Metadata(); err == nil {
		attempt = int(md.NumDelivered)
	}
	// The call's logger is built only when something is logged: With is not free and
	// this is the hot path.
	log := func() *slog.Logger {
		return w.log.With("run_id", req.RunID, "step", req.Step, "call_id", req.Call.CallID, "tool", req.Call.Tool, "attempt", attempt)
	}
	if attempt > 1 {
		// A redelivery: the worker that had it died or stalled. If its result is already in
		// the stream, the tool does not run again.
		var stored bool
		err := w.retry(ctx, msg, log, "look up the stored result", func() (err error) {
			stored, err = w.resultStored(ctx, req)
			return err
		})
		if err != nil {
			return err
		}
		if stored {
			log().Info("result already stored, call not run again")
			return nil
		}
	}

	var res events.ToolResult
	switch {
	case attempt >= w.cfg.MaxDeliver && attempt > 1:
		res = failedResult(req.Call, events.CodeToolInternalError,
			fmt.Sprintf("the call did not finish in %d attempts (its executor crashed or stalled each time); it was not run again", attempt-1))
	case len(req.AllowedTools) > 0 && !contains(req.AllowedTools, req.Call.Tool) && w.known(req.Call.Tool):
		res = rejectedResult(req.Call, events.CodeNotAuthorized, fmt.Sprintf("tool %q is not allowed in this run", req.Call.Tool))
	default:
		t, known := w.exec.Registry().Lookup(req.Call.Tool)
		if known && t.NeedsApproval {
			d, err := w.bus.StepDecision(ctx, req.RunID, req.Step, req.Call.CallID)
			switch {
			case errors.Is(err, events.ErrNotFound):
				return w.wait(ctx, req, log())
			case err != nil:
				return err
			case !d.Granted:
				msg := "a person denied this call"
				if d.Why != "" {
					msg += ": " + d.Why
				}
				res = rejectedResult(req.Call, events.CodeApprovalDenied, msg)
			}
		}
		if res.Status == "" {
			res, err = w.run(ctx, msg, req, attempt)
			if err != nil {
				return err
			}
		}
	}
	res.Attempt = attempt
	res.Executor = w.cfg.Instance
	// The call ran: its result must not be lost to a bus hiccup (a redelivered call whose
	// result is not stored runs again), so storing it is retried in place.
	if err := w.retry(ctx, msg, log, "store the large output", func() error {
		return w.keepLargeOutput(ctx, req, &res)
	}); err != nil {
		return err
	}
	err = w.retry(ctx, msg, log, "publish the result", func() error {
		_, err := w.bus.Publish(ctx, events.SubjectToolFinished(req.RunID, req.Call.Tool), events.Meta{
			ID: events.IDToolFinished(req.RunID, req.Step, req.Call.CallID), Type: events.TypeToolFinished,
			Source: w.source, RunID: req.RunID, Step: req.Step, CallID: req.Call.CallID,
			CallIndex: req.CallIndex, CallCount: req.CallCount, HasCall: true, TraceParent: meta.TraceParent,
		}, events.ToolFinished{RunID: req.RunID, Step: req.Step, CallIndex: req.CallIndex, CallCount: req.CallCount, ToolResult: res})
		return err
	})
	if err != nil {
		return err
	}
	if w.log.Enabled(ctx, slog.LevelDebug) {
		log().Debug("call finished", "status", res.Status, "code", res.Code(), "duration_ms", res.DurationMS)
	}
	return nil
}

// run executes the call with its deadline, cancellation and InProgress heartbeats.
func (w *Worker) run(ctx context.Context, msg jetstream.Msg, req events.ToolRequested, attempt int) (events.ToolResult, error) {
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !req.Deadline.IsZero() {
		var c2 context.CancelFunc
		callCtx, c2 = context.WithDeadline(callCtx, req.Deadline)
		defer c2()
	}
	untrack := w.track(req.RunID, &callHandle{cancel: cancel})
	defer untrack()
	callCtx = WithCallInfo(callCtx, CallInfo{
		RunID: req.RunID, Step: req.Step, CallIndex: req.CallIndex, Attempt: attempt,
		IdempotencyKey: req.RunID + "/" + strconv.Itoa(req.Step) + "/" + req.Call.CallID,
	})

	stopBeat := events.Heartbeat(msg, w.cfg.AckWait/3)
	res := w.exec.Execute(callCtx, req.Call, req.Principal)
	stopBeat()

	if ctx.Err() != nil && !errors.Is(context.Cause(callCtx), errRunCancelled) {
		// The worker is shutting down past its grace period: no result, the call is
		// redelivered to another worker.
		return res, fmt.Errorf("executor: shutdown interrupted call %s: %w", req.Call.CallID, ctx.Err())
	}
	return res, nil
}

// busRetryFor bounds how long a worker retries a failing bus operation in place.
const busRetryFor = 2 * time.Minute

// retry runs op until it succeeds, ctx ends or busRetryFor passes, backing off from
// 100ms to 2s and sending InProgress heartbeats meanwhile. A bus outage (a server
// restart, a cluster leader election) then costs no delivery of the call: every
// delivery counts toward MaxDeliver, and a redelivery could run the tool again.
func (w *Worker) retry(ctx context.Context, msg jetstream.Msg, log func() *slog.Logger, what string, op func() error) error {
	err := op()
	if err == nil {
		return nil
	}
	stopBeat := events.Heartbeat(msg, w.cfg.AckWait/3)
	defer stopBeat()
	deadline := time.Now().Add(busRetryFor)
	delay := 100 * time.Millisecond
	for n := 1; time.Now().Before(deadline); n++ {
		log().Warn("bus operation failed, retrying", "op", what, "retry", n, "error", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		if err = op(); err == nil {
			return nil
		}
		delay = min(2*delay, 2*time.Second)
	}
	return err
}

func (w *Worker) wait(ctx context.Context, req events.ToolRequested, log *slog.Logger) error {
	_, err := w.bus.Publish(ctx, events.SubjectToolWaiting(req.RunID, req.Call.Tool), events.Meta{
		ID: events.IDToolWaiting(req.RunID, req.Step, req.Call.CallID), Type: events.TypeToolWaiting,
		Source: w.source, RunID: req.RunID, Step: req.Step, CallID: req.Call.CallID,
		CallIndex: req.CallIndex, CallCount: req.CallCount, HasCall: true,
	}, events.ToolWaiting{RunID: req.RunID, Step: req.Step, CallIndex: req.CallIndex, CallCount: req.CallCount, Call: req.Call})
	if err == nil {
		log.Info("call waits for approval")
	}
	return err
}

// keepLargeOutput moves an output too large for an event to the object store.
func (w *Worker) keepLargeOutput(ctx context.Context, req events.ToolRequested, res *events.ToolResult) error {
	if len(res.Output) <= w.cfg.InlineOutputMax {
		return nil
	}
	name := req.RunID + "/" + strconv.Itoa(req.Step) + "/" + req.Call.CallID
	ref, err := w.bus.PutOutput(ctx, name, res.Output)
	if err != nil {
		return err
	}
	if res.Truncated == nil {
		res.Truncated = &events.Truncation{OriginalBytes: len(res.Output), KeptBytes: len(res.Content)}
	}
	res.Truncated.Ref = ref
	res.Output = nil
	return nil
}

// resultStored reports whether the stream already holds the tool.finished of req.
func (w *Worker) resultStored(ctx context.Context, req events.ToolRequested) (bool, error) {
	cons, err := w.bus.Stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.SubjectToolFinished(req.RunID, req.Call.Tool)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return false, fmt.Errorf("executor: look up stored result: %w", err)
	}
	want := events.IDToolFinished(req.RunID, req.Step, req.Call.CallID)
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return false, fmt.Errorf("executor: look up stored result: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if m.Headers().Get(events.HeaderMsgID) == want {
				return true, nil
			}
		}
		if err := batch.Error(); err != nil {
			return false, fmt.Errorf("executor: look up stored result: %w", err)
		}
		if n == 0 {
			return false, nil
		}
	}
}

func (w *Worker) known(tool string) bool {
	_, ok := w.exec.Registry().Lookup(tool)
	return ok
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
