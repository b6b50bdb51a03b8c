package planner

import (
	"fmt"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/workerconfig"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// The planner's configuration: its fields, their defaults and the ranges New accepts,
// and the Metrics it reports to. Kept apart from the worker so a reader of one does not
// wade through the other.

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

func (nopMetrics) RunEnded(string, string) {}

// Defaults of Config (the shared ones are workerconfig.DefaultConcurrency and its siblings).
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
