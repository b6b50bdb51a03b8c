// Package telemetry exposes what toolbus workers do to operators: Prometheus metrics,
// /healthz and /readyz on one HTTP address.
//
// The worker packages do not import it: each defines the small Metrics interface it
// calls (worker.Metrics, planner.Metrics, injector.Metrics) and events defines
// ServeObserver; *Metrics implements all of them, and cmd/toolbus/internal/node (the binary) and
// worker.Serve (custom executors) wire it in.
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
)

// Metric names exported by toolbus. The dashboard test checks that deploy/grafana only
// queries these (and the series Prometheus derives from them).
const (
	MetricToolCalls        = "toolbus_tool_calls_total"
	MetricToolCallDuration = "toolbus_tool_call_duration_seconds"
	MetricToolInFlight     = "toolbus_tool_calls_in_flight"
	MetricQueuePending     = "toolbus_tool_queue_pending"
	MetricQueueAckPending  = "toolbus_tool_queue_ack_pending"
	MetricStepJoin         = "toolbus_step_join_duration_seconds"
	MetricModelDuration    = "toolbus_model_call_duration_seconds"
	MetricModelErrors      = "toolbus_model_call_errors_total"
	MetricModelTokens      = "toolbus_model_tokens_total"
	MetricRunsEnded        = "toolbus_runs_ended_total"
	MetricRedeliveries     = "toolbus_redeliveries_total"
	MetricPoison           = "toolbus_poison_terminated_total"
	MetricReady            = "toolbus_ready"
	MetricPermissionDenied = "toolbus_permission_denied_total"
	MetricContractRefused  = "toolbus_tool_contract_refused_total"
	MetricQueuesParked     = "toolbus_tool_queues_parked"
	MetricWritesRefused    = "toolbus_tenant_writes_refused_total"
	MetricCheckpointSize   = "toolbus_checkpoint_size"
	MetricCheckpointsStop  = "toolbus_checkpoints_refused"
)

// Metrics holds the collectors of one process; every role of the process shares it, and
// it exports the collectors of those roles only (New's roles).
// Its methods implement worker.Metrics, planner.Metrics, injector.Metrics and, through
// Observer, consume.Observer.
type Metrics struct {
	reg *prometheus.Registry

	calls     *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	inflight  *prometheus.GaugeVec
	join      prometheus.Histogram
	modelDur  *prometheus.HistogramVec
	modelErrs *prometheus.CounterVec
	tokens    *prometheus.CounterVec
	runs      *prometheus.CounterVec
	redeliver *prometheus.CounterVec
	poison    *prometheus.CounterVec
	denied    prometheus.Counter
	refused   *prometheus.CounterVec
	parked    prometheus.Gauge
	writes    *prometheus.CounterVec
	cpSize    prometheus.Gauge
	cpRefused prometheus.Gauge

	mu     sync.Mutex
	roles  map[string]int // role -> consume loops serving
	ready  *prometheus.GaugeVec
	queues *queueCollector
	checks []func() error // more readiness conditions (WatchPermissions)
	failed string         // why the process cannot work any more (Failed): /healthz fails
}

// Failed makes /healthz fail with reason from now on: the process cannot work any more
// (its NATS connection closed for good) and is stopping.
func (m *Metrics) Failed(reason string) {
	m.mu.Lock()
	m.failed = reason
	m.mu.Unlock()
}

// The roles whose collectors New registers.
const (
	RolePlanner  = "planner"
	RoleExecutor = "executor"
	RoleInjector = "injector"
)

// New returns the metrics of a process that runs roles (every role when none is named),
// registered with a registry of their own that also holds the Go runtime and process
// collectors and what every role reports (readiness, redeliveries, poison messages,
// permission denials). A role's own collectors are registered only where it runs: an
// executor exports no step-join histogram that would stay at 0.
func New(roles ...string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricToolCalls,
			Help: "Tool calls finished by executors (results published), by tool, status and error code."},
			[]string{"tool", "status", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricToolCallDuration,
			Help:    "Time tools ran, by tool (calls refused without running are not counted).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}},
			[]string{"tool"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricToolInFlight,
			Help: "Tool calls running in this process, by tool."}, []string{"tool"}),
		join: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricStepJoin,
			Help:    "Time the injector took to join a batch of results into a step's record and settle the step.",
			Buckets: prometheus.ExponentialBuckets(.0005, 2, 16)}),
		modelDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricModelDuration,
			Help:    "Model call latency, by the run's model (failed calls included).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 5, 10, 20, 30, 60, 120}},
			[]string{"model"}),
		modelErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricModelErrors,
			Help: "Model calls that failed, by model."}, []string{"model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricModelTokens,
			Help: "Tokens reported by model calls, by model and type (input, output)."}, []string{"model", "type"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRunsEnded,
			Help: "Runs ended by this process, by outcome and code."}, []string{"outcome", "code"}),
		redeliver: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRedeliveries,
			Help: "Messages handled on a second or later delivery, by consumer."}, []string{"consumer"}),
		poison: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricPoison,
			Help: "Poison messages terminated (never redelivered), by consumer."}, []string{"consumer"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricContractRefused,
			Help: "Tool contracts the catalog refused because they differ from the registered one (no version bump), by tool."}, []string{"tool"}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricQueuesParked,
			Help: "Tool queues of this process that are parked: idle, not pulling until a call is published for their tool."}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricWritesRefused,
			Help: "Writes of tenants in accounts of their own that the injector's write service refused, by tenant (team.<team> or client.<identity>) and code (400: form or size, 429: bytes per second)."},
			[]string{"tenant", "code"}),
		cpSize: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricCheckpointSize,
			Help: "Messages of the event stream the latest checkpoint this process signed covers (audit/checkpoint)."}),
		cpRefused: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricCheckpointsStop,
			Help: "1 when this process stopped signing checkpoints: the event stream no longer hashes to the latest one signed (its past rewritten)."}),
		ready: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricReady,
			Help: "1 when the role's consumers are bound and consuming, else 0."}, []string{"role"}),
		denied: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricPermissionDenied,
			Help: "Operations the server refused to this process's credentials (permissions violations)."}),
		roles: map[string]int{},
	}
	reg.MustRegister(m.redeliver, m.poison, m.ready, m.denied,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if len(roles) == 0 {
		roles = []string{RolePlanner, RoleExecutor, RoleInjector}
	}
	own := map[string][]prometheus.Collector{
		RoleExecutor: {m.calls, m.duration, m.inflight, m.refused, m.parked},
		RolePlanner:  {m.modelDur, m.modelErrs, m.tokens, m.runs},
		RoleInjector: {m.join, m.runs, m.writes, m.cpSize, m.cpRefused},
	}
	registered := map[prometheus.Collector]bool{}
	for _, role := range roles {
		for _, c := range own[role] {
			if !registered[c] { // runs is both the planner's and the injector's
				registered[c] = true
				reg.MustRegister(c)
			}
		}
	}
	return m
}

// Registry is the registry the metrics are in (to serve or gather them).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// CallStarted implements worker.Metrics.
func (m *Metrics) CallStarted(tool string) { m.inflight.WithLabelValues(tool).Inc() }

// CallStopped implements worker.Metrics.
func (m *Metrics) CallStopped(tool string) { m.inflight.WithLabelValues(tool).Dec() }

// CallFinished implements worker.Metrics.
func (m *Metrics) CallFinished(tool, status, code string, d time.Duration, ran bool) {
	m.calls.WithLabelValues(tool, status, code).Inc()
	if ran {
		m.duration.WithLabelValues(tool).Observe(d.Seconds())
	}
}

// ContractRefused implements worker.Metrics.
func (m *Metrics) ContractRefused(tool string) { m.refused.WithLabelValues(tool).Inc() }

// ModelCalled implements planner.Metrics.
func (m *Metrics) ModelCalled(model string, d time.Duration, u toolbus.Usage, err error) {
	if model == "" {
		model = "default"
	}
	m.modelDur.WithLabelValues(model).Observe(d.Seconds())
	if err != nil {
		m.modelErrs.WithLabelValues(model).Inc()
		return
	}
	m.tokens.WithLabelValues(model, "input").Add(float64(u.InputTokens))
	m.tokens.WithLabelValues(model, "output").Add(float64(u.OutputTokens))
}

// StepJoined implements injector.Metrics.
func (m *Metrics) StepJoined(d time.Duration) { m.join.Observe(d.Seconds()) }

// WriteRefused counts a tenant's write the write service refused (intake.Metrics).
func (m *Metrics) WriteRefused(tenant string, code int) {
	m.writes.WithLabelValues(tenant, strconv.Itoa(code)).Inc()
}

// CheckpointSigned implements checkpoint.Metrics.
func (m *Metrics) CheckpointSigned(size int64) { m.cpSize.Set(float64(size)) }

// CheckpointsRefused implements checkpoint.Metrics: the gauge goes to 1 (the service
// logged why). Not /readyz: the injector still does its work, and a deployment waits
// for every role's readiness before it starts a run (docker-compose.yml).
func (m *Metrics) CheckpointsRefused(string) { m.cpRefused.Set(1) }

// RunEnded implements planner.Metrics and injector.Metrics.
func (m *Metrics) RunEnded(outcome, code string) { m.runs.WithLabelValues(outcome, code).Inc() }

// Observer returns the consume.Observer of a role's consume loops: it counts
// redeliveries and poison messages and makes the role ready while its loops serve.
// Registering a role makes /readyz wait for it.
func (m *Metrics) Observer(role string) consume.Observer {
	m.mu.Lock()
	if _, ok := m.roles[role]; !ok {
		m.roles[role] = 0
		m.ready.WithLabelValues(role).Set(0)
	}
	m.mu.Unlock()
	return &observer{m: m, role: role}
}

// Ready reports whether every registered role has a consume loop serving, with the
// roles that do not.
func (m *Metrics) Ready() (bool, []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var notReady []string
	for role, n := range m.roles {
		if n <= 0 {
			notReady = append(notReady, role)
		}
	}
	return len(m.roles) > 0 && len(notReady) == 0, notReady
}

// WatchPermissions counts, logs and reports as not ready (/readyz, until
// connect.DenialHold passes without another) every operation the server refuses to the
// bus's credentials: a role missing a permission fails its work, it must not look
// healthy.
func (m *Metrics) WatchPermissions(bus *events.Bus, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	bus.OnDenied(func(pe *connect.PermissionError) {
		m.denied.Inc()
		log.Error("the server refused an operation to this process's credentials", "op", pe.Op, "subject", pe.Subject)
	})
	m.mu.Lock()
	m.checks = append(m.checks, func() error {
		if pe, at, ok := bus.Denial(); ok {
			return fmt.Errorf("%w (%s ago)", pe, time.Since(at).Round(time.Second))
		}
		return nil
	})
	m.mu.Unlock()
}

// problems returns what the readiness checks report.
func (m *Metrics) problems() []string {
	m.mu.Lock()
	checks := m.checks
	m.mu.Unlock()
	var out []string
	for _, c := range checks {
		if err := c(); err != nil {
			out = append(out, err.Error())
		}
	}
	return out
}

type observer struct {
	m    *Metrics
	role string
}

func (o *observer) Serving([]string) { o.add(1) }
func (o *observer) Stopped([]string) { o.add(-1) }

func (o *observer) add(d int) {
	o.m.mu.Lock()
	o.m.roles[o.role] += d
	v := 0.0
	if o.m.roles[o.role] > 0 {
		v = 1
	}
	o.m.mu.Unlock()
	o.m.ready.WithLabelValues(o.role).Set(v)
}

func (o *observer) Redelivered(consumer string) { o.m.redeliver.WithLabelValues(consumer).Inc() }
func (o *observer) Terminated(consumer string)  { o.m.poison.WithLabelValues(consumer).Inc() }

// Parked implements consume.ParkObserver.
func (o *observer) Parked(_ string, parked bool) {
	if parked {
		o.m.parked.Inc()
	} else {
		o.m.parked.Dec()
	}
}

// WatchQueues adds the pending calls of every tool queue in the catalog, read from the
// queues' consumer info on each scrape (bounded by timeout, default 2s). A scrape during
// a bus outage reports no queue series rather than stale ones.
func (m *Metrics) WatchQueues(bus *events.Bus, timeout time.Duration, log *slog.Logger) {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	if bus != nil && bus.TeamAccount() {
		// The gauges are read from the queues' consumer infos, which the core exports to
		// no team (a flood of them would time out every tenant's infos: events/teamqueue);
		// the core's roles export them.
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.queues != nil {
		return
	}
	m.queues = &queueCollector{bus: bus, timeout: timeout, log: log,
		pending: prometheus.NewDesc(MetricQueuePending,
			"Calls waiting in a tool's queue (consumer tool_<tool>), not yet delivered to an executor.", []string{"tool"}, nil),
		ackPending: prometheus.NewDesc(MetricQueueAckPending,
			"Calls of a tool's queue delivered to an executor and not yet acknowledged.", []string{"tool"}, nil),
	}
	m.reg.MustRegister(m.queues)
}

// QueuesOf makes the queue gauges those of the tools names returns (an executor's
// served tools) instead of the catalog's: an executor in a team account may not read
// the catalog whole, only the queues of its own tools. Nil-safe; after WatchQueues.
func (m *Metrics) QueuesOf(names func() []string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.queues != nil {
		m.queues.mu.Lock()
		m.queues.names = names
		m.queues.mu.Unlock()
	}
}

type queueCollector struct {
	bus                 *events.Bus
	timeout             time.Duration
	log                 *slog.Logger
	pending, ackPending *prometheus.Desc

	mu    sync.Mutex
	names func() []string // the tools whose queues to read; nil: the catalog's
}

// tools are the tools whose queues a scrape reads.
func (c *queueCollector) tools(ctx context.Context) ([]string, error) {
	c.mu.Lock()
	names := c.names
	c.mu.Unlock()
	if names != nil {
		return names(), nil
	}
	contracts, err := c.bus.Store().Contracts(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(contracts))
	for _, tc := range contracts {
		out = append(out, tc.Name)
	}
	return out, nil
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	tools, err := c.tools(ctx)
	if err != nil {
		c.log.Debug("metrics: tool catalog unreadable", "error", err)
		return
	}
	for _, tool := range tools {
		q, err := c.bus.ToolQueueInfo(ctx, tool)
		if err != nil {
			continue // no queue yet (no executor ever served it) or the bus is away
		}
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(q.Pending), tool)
		ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(q.InFlight), tool)
	}
}
