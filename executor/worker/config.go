package worker

import (
	"fmt"
	"time"

	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// The worker's configuration: its fields, their defaults and the ranges New accepts, and
// the Metrics it reports to. Kept apart from the worker so a reader of one does not wade
// through the other.

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

func (nopMetrics) CallStarted(string) {}

func (nopMetrics) CallStopped(string) {}

func (nopMetrics) CallFinished(string, string, string, time.Duration, bool) {}

func (nopMetrics) ContractRefused(string) {}

// Defaults of Config (the shared ones are workerconfig.DefaultConcurrency and its siblings).
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
