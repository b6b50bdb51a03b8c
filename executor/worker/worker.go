package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/retry"
)

// Worker consumes tool.requested, runs each call through the executor.Executor and publishes
// exactly one tool.finished per call, acknowledging the request only once the result is
// stored in the stream.
type Worker struct {
	cfg    Config
	bus    *events.Bus
	exec   *executor.Executor
	source string
	log    *slog.Logger
	// boot is random per process start: with the instance name it identifies this
	// worker in its instance record, claims and run slots (see store.Instance.Boot).
	boot  string
	lease *lease
	// queueWait is the shortest AckWait of the queues this worker consumes (liveness.go).
	queueWait atomic.Int64

	syncMu     sync.Mutex // serializes Sync
	smu        sync.RWMutex
	serving    map[string]bool // tools this worker serves
	servedList []string        // the same, in the order offered (the instance record)
	// unreachable are the tools whose queue this worker's credentials no longer reach
	// (reach.go): registered, not served until their queue answers again.
	unreachable []string
	runCtx      context.Context // Run's context, for queues added by Sync
	serveCfg    consume.Config

	mu        sync.Mutex
	inflight  map[string]map[*callHandle]struct{} // run id -> running calls
	claimed   map[string]bool                     // claim keys this worker is handling
	cancelled map[string]time.Time                // runs cancelled recently

	ends *follow.RunOutcomes // runs known to have ended, from their outcome events

	extra sync.WaitGroup // queues added by Sync

	handler handlerFunc // the stages and middleware of a delivery (handle.go)
}

type callHandle struct{ cancel context.CancelCauseFunc }

// errRunCancelled is the cancellation cause of calls of a cancelled run.
var errRunCancelled = errors.New("executor: run cancelled")

// New returns a worker that runs calls with exec, or the error of cfg.Validate.
func New(bus *events.Bus, exec *executor.Executor, cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	ends := follow.Outcomes(bus)
	boot := newBootID()
	w := &Worker{cfg: cfg, bus: bus, exec: exec, source: events.Source("executor", cfg.Instance), boot: boot,
		log:      cfg.Logger.With("component", "executor", "instance", cfg.Instance, "boot", boot),
		inflight: map[string]map[*callHandle]struct{}{}, claimed: map[string]bool{}, cancelled: map[string]time.Time{},
		ends: ends}
	w.lease = newLease(bus.Store().InstanceTTL(), w.leaseLost)
	w.queueWait.Store(int64(w.wantAckWait()))
	w.handler = w.pipeline()
	return w, nil
}

// leaseLost cancels every running call: the lease ran out, another executor may take
// them over from now on plus the margin.
func (w *Worker) leaseLost() {
	w.mu.Lock()
	n := 0
	for _, hs := range w.inflight {
		for h := range hs {
			h.cancel(errLeaseLost)
			n++
		}
	}
	w.mu.Unlock()
	w.log.Warn("lease lost: instance heartbeat not renewed in time; running calls cancelled and handed back",
		"calls_cancelled", n, "ttl", w.lease.ttl)
}

// Run binds the queue of every served tool (creating it when it does not exist and the
// credentials allow), starts the instance heartbeat, publishes the served tools to the
// catalog, then consumes calls until ctx ends, then drains: intake stops, in-flight calls
// get the grace period, then are cancelled, and the instance leaves the catalog.
func (w *Worker) Run(ctx context.Context) error {
	err := w.serve(ctx)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped while starting up (a catalog write cut short): a shutdown, not a failure.
		w.log.Info("executor stopped during start-up")
		return nil
	}
	return err
}

func (w *Worker) serve(ctx context.Context) error {
	ctx, stopWatch := w.watchConnection(ctx)
	defer stopWatch()
	served, err := w.served()
	if err != nil {
		return err
	}
	w.smu.Lock()
	w.serving = make(map[string]bool, len(served))
	for _, t := range served {
		w.serving[t] = true
	}
	w.servedList = served
	w.runCtx = ctx
	w.serveCfg = consume.Config{
		Concurrency: w.cfg.Concurrency, Grace: w.cfg.Grace, Logger: w.log, NakDelay: time.Second,
		MaxWait: w.beatEvery(), Observer: w.cfg.Observer,
		ParkAfter: w.cfg.ParkAfter,
	}
	if w.cfg.ParkAfter >= 0 {
		// Idle tool queues stop pulling until a call is published for them: a
		// deployment bound to many rarely used tools costs the server nothing for them.
		// Their calls are published on the event stream and copied into the queue
		// stream by the server: the doorbell listens where they are published.
		w.serveCfg.Doorbell = consume.NewPublishedDoorbell(w.bus.Conn(), events.QueuePublishedOn)
	}
	w.smu.Unlock()
	stopCancels, err := w.followCancels(ctx, served)
	if err != nil {
		return err
	}
	defer stopCancels()
	// Only the queues of the served tools: a call of a tool no executor serves is
	// answered by the planner (unknown_tool), so no executor consumes the unknown-tool
	// subject and no team may publish a result there for another team's call.
	consumers := make([]jetstream.Consumer, 0, len(served))
	missing := &MissingQueuesError{}
	for _, tool := range served {
		cons, err := w.queue(ctx, tool)
		var me *MissingQueuesError
		if errors.As(err, &me) {
			// Go on: one error names every queue an admin must create, not the first.
			missing.Tools = append(missing.Tools, tool)
			missing.Err = cmp.Or(missing.Err, me.Err)
			continue
		}
		if err != nil {
			return err
		}
		consumers = append(consumers, cons)
	}
	if missing.Err != nil {
		return missing
	}
	w.smu.Lock()
	w.serveCfg.MaxWait = w.beatEvery() // a bound queue may wait less than this worker's own
	w.smu.Unlock()
	// The instance is live before its tools are offered: the planner offers a tool only
	// while an instance serves it.
	stopBeat, err := w.heartbeat(ctx, served)
	if err != nil {
		return err
	}
	defer stopBeat()
	defer w.watchReach(ctx)()
	for _, name := range served {
		t, ok := w.exec.Registry().Lookup(name)
		if !ok {
			continue // unregistered while the worker started: Sync takes it out of the record
		}
		if err := w.publishTool(ctx, t); err != nil {
			return err
		}
	}
	w.log.Info("executor serving", "tools", served, "concurrency", w.cfg.Concurrency,
		"stream", w.bus.Config().Stream, "nats", w.bus.Conn().ConnectedUrlRedacted())
	err = consume.ServeAll(ctx, consumers, w.serveCfg, w.handle)
	w.extra.Wait()
	if cause := context.Cause(ctx); errors.Is(cause, ErrConnectionClosed) {
		err = cause
	}
	w.log.Info("executor stopped", "error", err)
	return err
}

// MissingQueuesError is returned by Run when the queues of some tools do not exist and
// the worker could not create them (credentials that may not create consumers): an
// administrator creates them all with the one command Error names.
type MissingQueuesError struct {
	// Tools whose queue is missing, in the order the worker serves them.
	Tools []string
	// Err is the first creation failure.
	Err error
}

func (e *MissingQueuesError) Error() string {
	return fmt.Sprintf("executor: the queues of %d tool(s) do not exist and could not be created (%v): %s; an admin creates them with `toolbus init --tools %s` (or `toolbus init` with this executor's TOOLBUS_TOOLS, TOOLBUS_EXECUTOR_TOOLS and TOOLBUS_MCP_CONFIG)",
		len(e.Tools), e.Err, strings.Join(e.Tools, ", "), strings.Join(e.Tools, ","))
}

func (e *MissingQueuesError) Unwrap() error { return e.Err }

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

func (w *Worker) track(run string, h *callHandle, lv leaseView) (untrack func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, done := w.cancelled[run]; done {
		h.cancel(errRunCancelled)
	}
	if !lv.valid() { // lost between the start of the call and here: leaseLost missed it
		h.cancel(errLeaseLost)
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

// runEnded returns the outcome of a run that already ended, or "" while it goes on: from
// the outcome events the worker follows when they answer for the run, else from the run
// state.
func (w *Worker) runEnded(ctx context.Context, run string, startSeq uint64) (toolbus.RunStatus, error) {
	if status, ok := w.ends.Lookup(run, startSeq); ok {
		return status, nil
	}
	if w.bus.TeamAccount() {
		return "", nil // a team reads no run state: the run's end reaches it as a cancel
	}
	state, _, err := w.bus.Store().RunState(ctx, run)
	if err != nil && !errors.Is(err, events.ErrRunNotFound) {
		return "", err
	}
	if state.Status.Terminal() {
		return state.Status, nil
	}
	return "", nil
}

// hold marks a call as handled by this process; false when it already is.
func (w *Worker) hold(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.claimed[key] {
		return false
	}
	w.claimed[key] = true
	return true
}

func (w *Worker) release(key string) {
	w.mu.Lock()
	delete(w.claimed, key)
	w.mu.Unlock()
}

// run executes the call with its deadline, cancellation and InProgress heartbeats.
func (w *Worker) run(ctx context.Context, msg jetstream.Msg, req toolbus.ToolRequested, rs *toolbus.RunStarted, attempt int, lv leaseView) (toolbus.ToolResult, error) {
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if deadline := callDeadline(req, rs); !deadline.IsZero() {
		var c2 context.CancelFunc
		callCtx, c2 = context.WithDeadline(callCtx, deadline)
		defer c2()
	}
	untrack := w.track(req.RunID, &callHandle{cancel: cancel}, lv)
	defer untrack()
	callCtx = executor.WithCallInfo(callCtx, executor.CallInfo{
		RunID: req.RunID, Step: req.Step, CallID: req.Call.CallID, CallIndex: req.CallIndex, Tool: req.Call.Tool,
		Principal: rs.Principal, Attempt: attempt,
		IdempotencyKey: req.RunID + "/" + strconv.Itoa(req.Step) + "/" + req.Call.CallID,
		Lease:          lv,
	})

	// The tool's progress reports go to a publisher of their own, throttled; its last
	// report is published before the result.
	sink, stopProgress := w.startProgress(ctx, msg, req, attempt, lv)
	callCtx = executor.WithProgressSink(callCtx, sink)
	// Its log lines go to a publisher of their own, in order, before the result.
	logSink, stopLogs := w.startLogs(ctx, req, attempt, lv)
	callCtx = executor.WithLogSink(callCtx, logSink)
	// Its questions go to the run's caller; it waits for the answer within its timeout.
	callCtx = executor.WithAsker(callCtx, w.asker(req, attempt, lv))
	stopBeat := consume.Heartbeat(msg, w.beatEvery())
	res := w.exec.Execute(callCtx, req.Call, rs.Principal)
	stopBeat()
	stopProgress()
	stopLogs()

	if errors.Is(context.Cause(callCtx), errLeaseLost) || !lv.valid() {
		return res, fmt.Errorf("call %s: %w", req.Call.CallID, errLeaseLost)
	}
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
// delivery counts toward MaxDeliver, and a redelivery could run the tool again. So does
// a write the core's write service refused over the team's bytes per second
// (events.ErrTenantQuota) or could not forward (503); one it refused for its form
// (400, events.WriteRefusedForGood) is refused again however often it is sent: it
// returns at once, and the call ends as one the credentials may not handle (denied).
func (w *Worker) retry(ctx context.Context, msg jetstream.Msg, log func() *slog.Logger, what string, op func() error) error {
	stopBeat := func() {}
	defer func() { stopBeat() }()
	start := time.Now()
	return retry.Do(ctx, retry.Policy{For: busRetryFor, Base: 100 * time.Millisecond, Max: 2 * time.Second,
		OnError: func(n int, err error, wait time.Duration) (time.Duration, error) {
			if derr := w.bus.Denied(start, err); errors.Is(derr, connect.ErrPermissionDenied) {
				return 0, derr // retrying cannot fix missing permissions
			}
			if errors.Is(err, errLeaseLost) {
				return 0, err // retrying cannot bring the lease back in time
			}
			if events.WriteRefusedForGood(err) {
				return 0, err // nor a write the core's write service does not admit
			}
			if n == 1 { // heartbeats only once the operation fails: the common case costs none
				stopBeat = consume.Heartbeat(msg, w.beatEvery())
			}
			log().Warn("bus operation failed, retrying", "op", what, "retry", n, "error", err)
			return wait, nil
		}}, func(context.Context) error { return op() })
}

func (w *Worker) wait(ctx context.Context, req toolbus.ToolRequested, log *slog.Logger) error {
	_, err := w.bus.PublishEvent(ctx, events.ToolWaitingEvent(w.source,
		toolbus.ToolWaiting{RunID: req.RunID, Step: req.Step, CallIndex: req.CallIndex, CallCount: req.CallCount, Call: req.Call}))
	if err == nil {
		log.Info("call waits for approval")
	}
	return err
}
