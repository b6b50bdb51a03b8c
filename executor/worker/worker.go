package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/retry"
)

// Config configures an executor worker. Zero fields take their defaults; New refuses
// negative ones (Validate).
type Config struct {
	// WorkerConfig: Instance (default "executor"; names this process in results too),
	// Concurrency (the most calls this worker runs at once), AckWait (the longest a
	// call whose worker died waits before it is redelivered: the queues this worker
	// creates wait workerconfig.QueueAckWait, no longer than the instance TTL; running calls
	// send InProgress heartbeats every third of it; a queue that exists keeps its
	// settings),
	// MaxDeliver (the executions of one call, counted by its claim: each execution that
	// an executor started and did not finish counts; the last one does not run the tool
	// but reports tool_internal_error, so a call that keeps killing its executor still
	// ends with exactly one result), Grace (for in-flight calls at shutdown before they
	// are cancelled), Logger.
	workerconfig.WorkerConfig
	// Tools limits this deployment to a subset of the registry (empty: every tool).
	// Each tool has one queue (a durable consumer, events.ToolConsumer) shared by every
	// process that serves it, in any deployment, so subsets may overlap freely.
	Tools []string
	// RunMaxInFlight bounds the calls of one run in flight across the whole fleet
	// (default 32; negative: no bound), so one run asking for hundreds of slow calls
	// leaves room for the others. A call over the bound is handed back and taken again
	// shortly after.
	RunMaxInFlight int
	// MaxAckPending bounds calls in flight across all workers of the consumer (default 1000).
	MaxAckPending int
	// InlineOutputMax is the largest output kept in the event itself (default 256 KiB);
	// larger outputs go to the outputs bucket and the result carries a reference.
	InlineOutputMax int
	// ProgressInterval is the least time between two tool.progress events of one call
	// (default DefaultProgressInterval): a report made sooner replaces the pending one.
	ProgressInterval time.Duration
	// ParkAfter is how long a tool queue must be idle before it stops pulling until a
	// call is published for it (default consume.DefaultParkAfter; negative: never). The
	// credentials need subscribe permission on the tools' tool.requested subjects
	// (deploy/nats/permissions.conf); without it idle queues keep pulling.
	ParkAfter time.Duration
	// Metrics, when set, records the calls this worker runs (telemetry.Metrics).
	Metrics Metrics
	// Observer, when set, watches the consume loop (readiness, redeliveries, poison).
	Observer consume.Observer
	// Tracer makes the span of each call (default: the global provider's, a no-op unless
	// tracing is configured).
	Tracer trace.Tracer
	// Team names the team that owns the tools this worker serves; the catalog records it
	// as each tool's owner. With per-team credentials (go run ./deploy/nats/gen -grants)
	// the server lets a team write the catalog entries, queues, claims, results and
	// outputs of its granted tools only, whatever this field says, and its instance
	// records only under this team's token (store.InstanceKey): the field must name the
	// team of the credentials, or the worker's heartbeat is refused and it does not start.
	Team string
	// ReplaceContracts lets this worker replace a registered contract that differs from
	// its own without a higher Version: an owner changing its tool on purpose. Without
	// it such an offer is refused: the worker does not start (or Sync fails), logs it
	// and counts it (Metrics.ContractRefused).
	ReplaceContracts bool
}

// Metrics records what a worker does. It is an interface so that a Worker does not
// depend on a metrics library; implementations must be safe for concurrent use.
type Metrics interface {
	// CallStarted is called when a call's tool starts running, CallStopped when it
	// stops (in flight is their difference).
	CallStarted(tool string)
	CallStopped(tool string)
	// CallFinished is called once per result the worker produces, with how long the tool
	// ran; ran is false for a call refused without running (unknown tool, not allowed,
	// denied, run ended).
	CallFinished(tool, status, code string, d time.Duration, ran bool)
	// ContractRefused is called when the catalog refused this worker's contract of tool
	// because it differs from the registered one (store.ErrContractChanged).
	ContractRefused(tool string)
}

type nopMetrics struct{}

func (nopMetrics) CallStarted(string)                                       {}
func (nopMetrics) CallStopped(string)                                       {}
func (nopMetrics) CallFinished(string, string, string, time.Duration, bool) {}
func (nopMetrics) ContractRefused(string)                                   {}

// Defaults of Config (the shared ones are events.DefaultConcurrency and its siblings).
const (
	// DefaultRunMaxInFlight is the default of Config.RunMaxInFlight.
	DefaultRunMaxInFlight = 32
	// DefaultMaxAckPending is the default of Config.MaxAckPending.
	DefaultMaxAckPending = 1000
	// DefaultInlineOutputMax is the default of Config.InlineOutputMax.
	DefaultInlineOutputMax = 256 << 10
)

// Validate reports the first field out of range (an *workerconfig.ConfigError wrapping
// workerconfig.ErrInvalidConfig); zero values are valid.
func (c Config) Validate() error {
	if err := c.WorkerConfig.Validate(); err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	var err error
	switch {
	case c.MaxAckPending < 0:
		err = workerconfig.InvalidField("MaxAckPending", c.MaxAckPending, fmt.Sprintf("1 or more (0: default %d)", DefaultMaxAckPending))
	case c.ProgressInterval < 0:
		err = workerconfig.InvalidField("ProgressInterval", c.ProgressInterval, fmt.Sprintf("positive (0: default %s)", DefaultProgressInterval))
	case c.InlineOutputMax < 0:
		err = workerconfig.InvalidField("InlineOutputMax", c.InlineOutputMax, fmt.Sprintf("1 or more (0: default %d)", DefaultInlineOutputMax))
	case c.Team != "" && !store.ValidTeam(c.Team):
		// The team is a token of the instance records' keys, which per-team credentials
		// are scoped by.
		err = workerconfig.InvalidField("Team", c.Team, "1 to 32 of [a-z0-9_-], starting with a letter or digit (empty: no team)")
	}
	if err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	return nil
}

func (c *Config) setDefaults() {
	c.WorkerConfig = c.WorkerConfig.WithDefaults("executor")
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	if c.RunMaxInFlight == 0 {
		c.RunMaxInFlight = DefaultRunMaxInFlight
	}
	if c.InlineOutputMax == 0 {
		c.InlineOutputMax = DefaultInlineOutputMax
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = DefaultProgressInterval
	}
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	if c.Tracer == nil {
		c.Tracer = otel.Tracer("github.com/toolbus/toolbus/executor")
	}
}

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

// Sync brings a running worker in line with its registry after tools were registered or
// unregistered at run time (tool providers such as MCP servers whose tool lists change):
// each new tool gets its queue and its contract in the catalog, and the instance record
// lists exactly the registered tools, so the planner stops offering removed ones at once.
// A worker limited to Config.Tools serves that fixed subset and ignores Sync.
// Sync before Run, or after Run returned, does nothing.
//
// Calls keep running while Sync talks to the bus: the read lock that every call takes
// is held only to read and to swap the set of served tools, never across network I/O.
func (w *Worker) Sync(ctx context.Context) error {
	if len(w.cfg.Tools) > 0 {
		return nil
	}
	w.syncMu.Lock() // one Sync at a time: each computes its changes from the last one's result
	defer w.syncMu.Unlock()
	w.smu.RLock()
	runCtx, serveCfg, serving, unreachable := w.runCtx, w.serveCfg, w.serving, w.unreachable
	w.smu.RUnlock()
	if runCtx == nil || runCtx.Err() != nil {
		return nil
	}
	// A tool whose queue the credentials no longer reach stays out until it does.
	names := slices.DeleteFunc(w.exec.Registry().Names(), func(n string) bool { return slices.Contains(unreachable, n) })
	var added []string
	for _, name := range names {
		t, ok := w.exec.Registry().Lookup(name)
		if !ok {
			continue
		}
		// Publishing every contract again also covers a tool whose schema changed.
		if err := w.publishTool(ctx, t); err != nil {
			return err
		}
		if !serving[name] { // serving is replaced, never modified: reading it unlocked is safe
			added = append(added, name)
		}
	}
	for _, name := range added {
		cons, err := w.queue(ctx, name)
		if err != nil {
			return err
		}
		w.extra.Go(func() {
			if err := consume.ServeAll(runCtx, []jetstream.Consumer{cons}, serveCfg, w.handle); err != nil {
				w.log.Error("queue stopped", "tool", name, "error", err)
			}
		})
	}
	next := make(map[string]bool, len(names))
	for _, n := range names {
		next[n] = true
	}
	w.smu.Lock()
	w.serving, w.servedList = next, names
	registered := w.exec.Registry().Names()
	w.unreachable = slices.DeleteFunc(slices.Clone(w.unreachable), func(n string) bool { return !slices.Contains(registered, n) })
	w.smu.Unlock()
	now := time.Now().UTC()
	in := store.Instance{Team: w.cfg.Team, Name: w.cfg.Instance, Boot: w.boot, Tools: names, Concurrency: w.cfg.Concurrency,
		StartedAt: now, HeartbeatAt: now}
	if err := w.writeLater(ctx, "record the instance's tools", func() error {
		_, err := w.bus.Store().PutInstance(ctx, in)
		return err
	}); err != nil {
		return err
	}
	w.log.Info("executor tools changed", "tools", names, "added", added)
	return nil
}

// publishTool offers t's contract, with this worker's team as owner, to the catalog. A
// refusal (the registered contract differs) is logged and counted here and returned.
func (w *Worker) publishTool(ctx context.Context, t executor.Tool) error {
	c := t.Contract()
	c.Owner = w.cfg.Team
	pctx, done := w.bus.Guard(ctx, "$KV.")
	err := done(w.writeLater(pctx, "publish the contract of "+t.Name, func() error {
		return w.bus.Store().PublishTool(pctx, c, w.cfg.ReplaceContracts)
	}))
	var changed *store.ContractChangedError
	if errors.As(err, &changed) {
		w.cfg.Metrics.ContractRefused(t.Name)
		w.log.Error("tool contract refused: the catalog holds a different contract for this tool",
			"tool", t.Name, "registered_owner", changed.Registered.Owner, "registered_version", changed.Registered.Version,
			"offered_owner", c.Owner, "offered_version", c.Version)
		return fmt.Errorf("executor: %w", err)
	}
	return err
}

// serves reports whether this worker serves tool now.
func (w *Worker) serves(tool string) bool {
	w.smu.RLock()
	defer w.smu.RUnlock()
	return w.serving[tool]
}

// servedTools returns the tools this worker serves now.
func (w *Worker) servedTools() []string {
	w.smu.RLock()
	defer w.smu.RUnlock()
	return w.servedList
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

// stampLease reads when the server stored the heartbeat at revision rev, sent at start,
// and moves the lease's server-clock deadline (results carry it as LeaseUntil). On a
// failed read the previous, earlier deadline stays: results stored after it are
// checked against their claim by the injector, which costs a read, never correctness.
func (w *Worker) stampLease(ctx context.Context, rev uint64, start time.Time) {
	rtt := time.Since(start)
	stored, err := w.bus.Store().InstanceStoredAt(ctx, w.cfg.Team, w.cfg.Instance, w.boot, rev)
	if err != nil {
		w.log.Debug("heartbeat's stored time not read; results keep the previous fencing deadline", "error", err)
		return
	}
	w.lease.stamp(stored, rtt)
}

// heartbeat records this instance in the instances bucket now and every
// lease.renewEvery, each acknowledged write renewing the lease; the returned stop ends
// the lease and removes the record.
func (w *Worker) heartbeat(ctx context.Context, served []string) (stop func(), err error) {
	start := time.Now()
	in := store.Instance{Team: w.cfg.Team, Name: w.cfg.Instance, Boot: w.boot, Tools: served, Concurrency: w.cfg.Concurrency,
		StartedAt: start.UTC(), HeartbeatAt: start.UTC()}
	var rev uint64
	err = w.writeLater(ctx, "record the instance", func() error {
		pctx, guarded := w.bus.Guard(ctx, "$KV.")
		// The lease counts from the write that passed, not from the first try.
		start = time.Now()
		in.StartedAt, in.HeartbeatAt = start.UTC(), start.UTC()
		var err error
		rev, err = w.bus.Store().PutInstance(pctx, in)
		return guarded(err)
	})
	if err != nil {
		return nil, err
	}
	w.lease.renewed(start)
	w.stampLease(ctx, rev, start)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		every := w.lease.renewEvery()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				in.Tools = w.servedTools()
				// A slow write still renews the lease from its start: it may take up to
				// the lease itself (a busy server), not only one period.
				pctx, cancel := context.WithTimeout(ctx, w.lease.ttl-w.lease.margin)
				start, rev, err := w.renew(pctx, &in, every/2)
				if err != nil {
					cancel()
					w.log.Warn("instance heartbeat failed", "error", err, "lease_deadline", w.lease.Deadline())
					continue
				}
				w.lease.renewed(start)
				w.stampLease(pctx, rev, start)
				cancel()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		w.lease.stop()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := w.bus.Store().DeleteInstance(dctx, w.cfg.Team, w.cfg.Instance, w.boot); err != nil {
			w.log.Warn("instance not removed from the catalog; it expires by itself", "error", err)
		}
	}, nil
}

// renew writes the instance record, and again in place while the core's write service
// refuses it over the team's bytes per second (or could not forward it), for up to
// within (half a period): left to the next period, three such refusals in a row would
// lapse the lease and hand every running call back, to run again. The refused writes
// spend nothing of the team's budget; the one that passes spends it as any write does.
// start is when the write that passed was sent: it, not the acknowledgement, bounds the
// record's expiry from below (the server stores it after it was sent).
func (w *Worker) renew(ctx context.Context, in *store.Instance, within time.Duration) (start time.Time, rev uint64, err error) {
	err = retry.Do(ctx, retry.Policy{For: within, Base: 20 * time.Millisecond, Max: 250 * time.Millisecond, Jitter: true,
		OnError: func(_ int, err error, wait time.Duration) (time.Duration, error) {
			if !events.WritePassesLater(err) {
				return 0, err
			}
			return wait, nil
		}}, func(ctx context.Context) (err error) {
		start = time.Now()
		in.HeartbeatAt = start.UTC()
		rev, err = w.bus.Store().PutInstance(ctx, *in)
		return err
	})
	return start, rev, err
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

// claimPoll is how often a delivery of a call that another live executor claimed checks
// whether that executor finished or died.
const claimPoll = time.Second

// takeoverHook, when set (tests), runs right after a take-over of a claim, before the
// look-up of a result stored meanwhile: where a late result of the earlier attempt
// races the new one.
var takeoverHook func()

// runFullDelay is the least delay before a call of a run at its cap is taken again
// (up to twice this, so the retries of a large step spread out).
const runFullDelay = 250 * time.Millisecond

// owned is the claim of a call this worker owns: the attempt it runs and the claim's
// revision, its fencing token (abandoning the attempt is a compare-and-set on it).
type owned struct {
	claim store.Claim
	rev   uint64
}

// claim takes the execution of a call before its tool runs, so a call runs at most once
// while the executor that claimed it holds its lease. It returns true when this worker
// owns the call and must produce its result, with the claim (its attempt is 1, or one
// more than the claim it took over); false when the call is done elsewhere (its result
// is stored) and the message is only acknowledged. When the claim belongs to a live
// executor it waits, sending heartbeats, until that executor stores the result, dies
// (its instance record, name and boot id, expired) or abandons the attempt; then the
// claim is taken over with a compare-and-set, and the call runs again with the same
// idempotency key.
func (w *Worker) claim(ctx context.Context, msg jetstream.Msg, queue string, req toolbus.ToolRequested, log func() *slog.Logger) (bool, owned, error) {
	mine := store.Claim{Team: w.cfg.Team, Instance: w.cfg.Instance, Boot: w.boot, Attempt: 1, At: time.Now().UTC()}
	var (
		cur     store.Claim
		rev     uint64
		claimed bool
	)
	err := w.retry(ctx, msg, log, "claim the call", func() (err error) {
		cur, rev, err = w.bus.Store().ClaimCall(ctx, queue, req.RunID, req.Step, req.Call.CallID, mine)
		claimed = err == nil
		if errors.Is(err, store.ErrClaimed) {
			return nil
		}
		return err
	})
	if err != nil {
		return false, owned{}, err
	}
	if claimed {
		return true, owned{mine, rev}, nil
	}
	stopBeat := consume.Heartbeat(msg, w.beatEvery())
	defer stopBeat()
	for {
		stored, err := w.resultStored(ctx, queue, req)
		stored = stored || cur.Done
		if err != nil {
			return false, owned{}, err
		}
		if stored {
			log().Info("result already stored, call not run again", "claimed_by", cur.Instance)
			return false, owned{}, nil
		}
		alive := false
		// Our own earlier claim (same name and boot): that handling is over (hold
		// keeps two handlings of a call in one process apart).
		if !cur.Abandoned && (cur.Instance != w.cfg.Instance || cur.Boot != w.boot) {
			if alive, err = w.bus.Store().InstanceAlive(ctx, cur.Team, cur.Instance, cur.Boot); err != nil {
				return false, owned{}, err
			}
		}
		if !alive {
			mine.Attempt, mine.Retries = cur.Attempt+1, cur.Retries
			nrev, err := w.bus.Store().TakeOverClaim(ctx, queue, req.RunID, req.Step, req.Call.CallID, mine, rev)
			if err == nil {
				if takeoverHook != nil {
					takeoverHook()
				}
				// A result stored between the check above and the take-over was
				// published by an earlier attempt (one that held its lease then, or a
				// late publication of one cut off): it is the call's. The claim says so,
				// so that the injector joins that result instead of waiting for this
				// attempt's.
				if stored, err := w.resultStored(ctx, queue, req); err != nil || stored {
					if err == nil {
						err = w.yield(ctx, msg, queue, req, owned{mine, nrev}, log)
					}
					return false, owned{}, err
				}
				if cur.Retry {
					log().Info("retrying the call by the tool's policy, with the same idempotency key", "attempt", mine.Attempt)
					return true, owned{mine, nrev}, nil
				}
				why := "the executor that claimed this call is gone"
				if cur.Abandoned {
					why = "the executor that claimed this call lost its lease and handed it back"
				}
				log().Warn(why+": running it again with the same idempotency key",
					"claimed_by", cur.Instance, "claimed_boot", cur.Boot, "attempt", mine.Attempt)
				return true, owned{mine, nrev}, nil
			}
			if !errors.Is(err, events.ErrConflict) {
				return false, owned{}, err
			}
		}
		select {
		case <-ctx.Done():
			return false, owned{}, ctx.Err()
		case <-time.After(claimPoll):
		}
		mine.Attempt, mine.Retries = 1, nil
		if cur, rev, err = w.bus.Store().ClaimCall(ctx, queue, req.RunID, req.Step, req.Call.CallID, mine); err == nil {
			return true, owned{mine, rev}, nil // the claim went away (expired with the retention): ours now
		} else if !errors.Is(err, store.ErrClaimed) {
			return false, owned{}, err
		}
	}
}

// yield marks this worker's attempt, which took the claim over, as yielded to the
// result an earlier attempt stored meanwhile: the attempt does not run.
func (w *Worker) yield(ctx context.Context, msg jetstream.Msg, queue string, req toolbus.ToolRequested, o owned, log func() *slog.Logger) error {
	o.claim.Yielded = true
	if err := w.markClaim(ctx, msg, queue, req, o, log, "yield the claim"); err != nil {
		return err
	}
	log().Info("result of an earlier attempt stored after the take-over: this attempt yields to it", "attempt", o.claim.Attempt)
	return nil
}

// abandon marks this worker's attempt at a call abandoned (its lease ran out before a
// result was stored), so that the next delivery runs the call again at once even though
// this executor is alive. A claim already taken over is left alone.
func (w *Worker) abandon(ctx context.Context, msg jetstream.Msg, queue string, req toolbus.ToolRequested, o owned, log func() *slog.Logger) error {
	o.claim.Abandoned = true
	if err := w.markClaim(ctx, msg, queue, req, o, log, "abandon the claim"); err != nil {
		return err
	}
	log().Warn("lease lost mid-call: attempt abandoned, the call is handed back", "attempt", o.claim.Attempt)
	return nil
}

// markClaim writes o.claim over the revision this worker owns. A conflict means the
// claim changed since (taken over) or an earlier try of this write landed: either way
// there is nothing left to mark.
func (w *Worker) markClaim(ctx context.Context, msg jetstream.Msg, queue string, req toolbus.ToolRequested, o owned, log func() *slog.Logger, what string) error {
	return w.retry(ctx, msg, log, what, func() error {
		_, err := w.bus.Store().TakeOverClaim(ctx, queue, req.RunID, req.Step, req.Call.CallID, o.claim, o.rev)
		if errors.Is(err, events.ErrConflict) {
			return nil
		}
		return err
	})
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

// keepLargeOutput moves an output too large for an event to the outputs bucket, under
// the key prefix of the call's queue.
func (w *Worker) keepLargeOutput(ctx context.Context, queue string, req toolbus.ToolRequested, res *toolbus.ToolResult) error {
	if err := w.keepLargeAttachments(ctx, queue, req, res); err != nil {
		return err
	}
	if len(res.Output) <= w.cfg.InlineOutputMax {
		return nil
	}
	ref, err := w.bus.Store().PutOutput(ctx, queue, req.RunID, req.Step, req.Call.CallID, res.Output)
	if errors.Is(err, store.ErrOutputsFull) {
		// Not retried: a full bucket does not empty itself within a lease, and waiting
		// would stall this call and every call with a large output. The result goes out
		// without the whole output (no ref); the model reads its bounded content as ever.
		w.log.Warn("large output not kept: the outputs bucket is full", "run_id", req.RunID, "call_id", req.Call.CallID,
			"tool", req.Call.Tool, "bytes", len(res.Output), "error", err)
		ref, err = "", nil
	}
	if err != nil {
		return err
	}
	if res.Truncated == nil {
		res.Truncated = &toolbus.Truncation{OriginalBytes: len(res.Output), KeptBytes: len(res.Content)}
	}
	res.Truncated.Ref = ref
	res.Output = nil
	return nil
}

// keepLargeAttachments moves to the outputs bucket the attachments that do not fit in
// the event beside the output: the attachments travel inline while the output and the
// inline attachments hold at most InlineOutputMax bytes in all.
func (w *Worker) keepLargeAttachments(ctx context.Context, queue string, req toolbus.ToolRequested, res *toolbus.ToolResult) error {
	inline := min(len(res.Output), w.cfg.InlineOutputMax)
	for i := range res.Attachments {
		a := &res.Attachments[i]
		if a.Ref != "" || inline+len(a.Data) <= w.cfg.InlineOutputMax {
			inline += len(a.Data)
			continue
		}
		ref, err := w.bus.Store().PutAttachment(ctx, queue, req.RunID, req.Step, req.Call.CallID, i, a.Data)
		if errors.Is(err, store.ErrOutputsFull) {
			// As a large output (keepLargeOutput): the result goes out with the
			// attachment described (no bytes, no ref) rather than waiting for room.
			w.log.Warn("large attachment not kept: the outputs bucket is full", "run_id", req.RunID, "call_id", req.Call.CallID,
				"tool", req.Call.Tool, "attachment", i, "bytes", len(a.Data), "error", err)
			a.Data = nil
			continue
		}
		if err != nil {
			return err
		}
		a.Ref, a.Data = ref, nil
	}
	return nil
}

// resultStored reports whether the stream already holds the tool.finished of req. It
// walks the results of the run's tool with direct gets (next message on the subject):
// an executor's credentials may not create consumers on the event stream.
func (w *Worker) resultStored(ctx context.Context, queue string, req toolbus.ToolRequested) (bool, error) {
	_, stored, err := w.bus.Stored(ctx, events.ToolFinishedEventOn(w.source, toolbus.ToolFinished{RunID: req.RunID, Step: req.Step,
		CallIndex: req.CallIndex, CallCount: req.CallCount, ToolResult: toolbus.ToolResult{CallID: req.Call.CallID, Tool: req.Call.Tool}}, queue))
	if err != nil {
		return false, fmt.Errorf("executor: look up stored result: %w", err)
	}
	return stored, nil
}
