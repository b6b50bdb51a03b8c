package injector

import (
	"fmt"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// The injector's configuration: its fields, their defaults and the ranges New accepts,
// and the Metrics it reports to. Kept apart from the worker so a reader of one does not
// wade through the other.

// Config configures an injector worker. Zero fields take their defaults; New refuses
// negative ones (Validate).
type Config struct {
	// WorkerConfig: Instance (default "injector"), Concurrency (messages handled at
	// once), AckWait (before a dead injector's unacknowledged results are redelivered to
	// another), MaxDeliver (default DefaultMaxDeliver, not workerconfig.DefaultMaxDeliver: the
	// deliveries of one event, with growing delays; on the last one, a store or publish
	// that keeps failing ends the run failed with code store_error instead of
	// redelivering forever), Grace, Logger.
	workerconfig.WorkerConfig
	// Durable is the consumer name shared by all injectors (default "injector").
	Durable string
	Rules   Rules
	// Defaults are the limits of runs that set none (the deadline and max steps the
	// stop rules check, the deadline of re-issued calls); a zero MaxSteps is
	// DefaultMaxSteps.
	Defaults toolbus.DefaultLimits
	// DeadlineGrace is how long after a run's deadline its timer fires (default
	// DefaultDeadlineGrace): the time for the timed_out results of executors to land
	// first.
	DeadlineGrace time.Duration
	// MaxTimers bounds the deadline timers held at once across all injectors (the timer
	// consumer's MaxAckPending, default DefaultMaxTimers); further runs get their timer
	// as slots free up.
	MaxTimers int
	// JoinWindow bounds how long the results of a step that came in wait for the step's
	// other results before they are written to its join state, so that a step is usually
	// one write instead of two or three (steps.gather); the result that completes the
	// step is never held. Default DefaultJoinWindow; a negative value writes at once.
	JoinWindow time.Duration
	// BeforeOutcome, when set, is called between the write of a run's terminal state and
	// the publish of its outcome event; an error aborts the handler there, as a crash
	// would. Fault-injection tests use it; production leaves it nil.
	BeforeOutcome func(toolbus.RunEnded) error
	// Metrics, when set, records step joins and the runs this injector ends.
	Metrics Metrics
	// Observer, when set, watches the consume loops (readiness, redeliveries, poison).
	Observer consume.Observer
	// Deciders are the identities who may decide on and cancel every run, besides each
	// run's principal and the approvers its start lists: the decision policy of a bus
	// shared by clients that must not decide on each other's runs. nil (or an entry
	// AnyoneDecides) lets everyone, as one party on its own bus needs; an empty, non-nil
	// list lets only each run's principal and approvers. A refused decision or cancel is
	// terminated with a NotDeciderError naming who may.
	Deciders []string
	// Quota bounds each principal's runs in flight, starts per second and run.started
	// size (quota.go); zero bounds nothing.
	Quota Quota
}

// Defaults of Config (the shared ones are workerconfig.DefaultConcurrency and its siblings).
const (
	// DefaultMaxSteps is the step limit of a run that sets none, when Config.Defaults
	// sets none either.
	DefaultMaxSteps = 10
	// DefaultMaxDeliver is the default of Config.MaxDeliver.
	DefaultMaxDeliver = 10
	// DefaultDeadlineGrace is the default of Config.DeadlineGrace.
	DefaultDeadlineGrace = 2 * time.Second
	// DefaultMaxRunTimeout is the default of Config.Defaults.MaxRunTimeout: the cap of
	// any run's deadline, from its start.
	DefaultMaxRunTimeout = 24 * time.Hour
	// DefaultMaxTimers is the default of Config.MaxTimers.
	DefaultMaxTimers = 100000
	// DefaultJoinWindow is the default of Config.JoinWindow: the results of a step whose
	// calls are quick come within it; a step with a slower call costs its first results
	// that much more time before they are stored, far below any acknowledgement wait.
	DefaultJoinWindow = 5 * time.Millisecond
)

// Validate reports the first field out of range (an *workerconfig.ConfigError wrapping
// workerconfig.ErrInvalidConfig); zero values are valid.
func (c Config) Validate() error {
	if err := c.WorkerConfig.Validate(); err != nil {
		return fmt.Errorf("injector: %w", err)
	}
	var err error
	switch {
	case c.DeadlineGrace < 0:
		err = workerconfig.InvalidField("DeadlineGrace", c.DeadlineGrace, fmt.Sprintf("0s or more (0: default %v)", DefaultDeadlineGrace))
	case c.MaxTimers < 0:
		err = workerconfig.InvalidField("MaxTimers", c.MaxTimers, fmt.Sprintf("1 or more (0: default %d)", DefaultMaxTimers))
	case c.Defaults.MaxSteps < 0:
		err = workerconfig.InvalidField("Defaults.MaxSteps", c.Defaults.MaxSteps, fmt.Sprintf("1 or more (0: default %d)", DefaultMaxSteps))
	case c.Defaults.RunTimeout < 0:
		err = workerconfig.InvalidField("Defaults.RunTimeout", c.Defaults.RunTimeout, "0s (none) or more")
	case c.Defaults.TokenBudget < 0:
		err = workerconfig.InvalidField("Defaults.TokenBudget", c.Defaults.TokenBudget, "0 (none) or more")
	default:
		err = c.Quota.Validate()
	}
	if err != nil {
		return fmt.Errorf("injector: %w", err)
	}
	return nil
}

// Metrics records what an injector does. It is an interface so that this package does
// not depend on a metrics library; implementations must be safe for concurrent use.
type Metrics interface {
	// StepJoined is called after a batch of results is joined into a step's record (the
	// compare-and-set write and what follows it: the next step or the outcome).
	StepJoined(d time.Duration)
	// RunEnded is called when this injector ends a run.
	RunEnded(outcome, code string)
}

type nopMetrics struct{}

func (nopMetrics) StepJoined(time.Duration) {}

func (nopMetrics) RunEnded(string, string) {}

func (c *Config) setDefaults() {
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	c.WorkerConfig = c.WorkerConfig.WithDefaults("injector")
	if c.Durable == "" {
		c.Durable = "injector"
	}
	if c.Defaults.MaxSteps == 0 {
		c.Defaults.MaxSteps = DefaultMaxSteps
	}
	if c.Defaults.MaxRunTimeout == 0 {
		c.Defaults.MaxRunTimeout = DefaultMaxRunTimeout
	}
	if c.DeadlineGrace == 0 {
		c.DeadlineGrace = DefaultDeadlineGrace
	}
	if c.MaxTimers == 0 {
		c.MaxTimers = DefaultMaxTimers
	}
	if c.JoinWindow == 0 {
		c.JoinWindow = DefaultJoinWindow
	}
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	c.Rules.setDefaults()
}
