package workerconfig

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/toolbus/toolbus/events"
)

// The defaults of WorkerConfig, in one place: the planner, the injector, the executor
// worker and the toolbus binary all read them from here.
const (
	// DefaultConcurrency is the messages (calls or steps) a worker handles at once.
	DefaultConcurrency = 64
	// DefaultAckWait is how long an unacknowledged message waits before it is
	// redelivered to another worker (live workers send heartbeats during long work).
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliver is the deliveries of one message before the worker gives up on it.
	DefaultMaxDeliver = 5
	// DefaultGrace is how long in-flight work may run after shutdown begins.
	DefaultGrace = 30 * time.Second
	// MinAckWait is the shortest AckWait a worker accepts: heartbeats and the consume
	// loop's hand-back delay are fractions of it.
	MinAckWait = time.Second
)

// QueueAckWait is the AckWait of a tool's queue: the executors' AckWait (0: the
// default), but no longer than their lease (instanceTTL, 0: the default; at least
// MinAckWait). A live executor tells the server every third of it that a call is still
// running (InProgress); a dead one stops, and the call is redelivered about when its
// claim may be taken over (the dead executor's instance record expires one TTL after
// its last renewal), not an ack wait of 30 s later.
func QueueAckWait(ackWait, instanceTTL time.Duration) time.Duration {
	if ackWait <= 0 {
		ackWait = DefaultAckWait
	}
	if instanceTTL <= 0 {
		instanceTTL = events.DefaultInstanceTTL
	}
	return min(ackWait, max(instanceTTL, MinAckWait))
}

// ErrInvalidConfig is wrapped by every error of a Validate method: a field out of its
// range. Constructors return it instead of replacing a bad value.
var ErrInvalidConfig = errors.New("invalid config")

// ConfigError is a field of a configuration out of its valid range. It wraps
// ErrInvalidConfig.
type ConfigError struct {
	// Field is the Go name of the field (Concurrency, AckWait...).
	Field string
	// Value is the value refused.
	Value any
	// Want describes the valid range.
	Want string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%v: %s %v: want %s", ErrInvalidConfig, e.Field, e.Value, e.Want)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// InvalidField returns the ConfigError of field: value is out of range, want describes
// the range. Config types of the worker packages use it in their Validate methods.
func InvalidField(field string, value any, want string) error {
	return &ConfigError{Field: field, Value: value, Want: want}
}

// WorkerConfig is what every worker of the pipeline (planner, injector, executor) is
// configured with. Zero fields take the defaults above; negative ones are refused by
// Validate. The envconfig tags are the TOOLBUS_* variables of the toolbus binary and of
// worker.Serve.
type WorkerConfig struct {
	// Instance names this process in event sources and logs (default: the role).
	Instance string `envconfig:"INSTANCE" desc:"name of this process in events and logs (default host-pid)"`
	// Concurrency is the messages handled at once (default DefaultConcurrency).
	Concurrency int `envconfig:"CONCURRENCY" desc:"calls (executor) or steps (planner, injector) handled at once per process"`
	// AckWait before the messages of a dead worker are redelivered to another (default
	// DefaultAckWait, at least MinAckWait); live workers send heartbeats. It applies to
	// the consumers a worker creates: one that exists keeps its settings.
	AckWait time.Duration `envconfig:"ACK_WAIT" desc:"redelivery delay of a call, step or result whose worker died (live workers send heartbeats)"`
	// MaxDeliver bounds the deliveries of one message (default DefaultMaxDeliver; each
	// role says what happens on the last one).
	MaxDeliver int `envconfig:"MAX_DELIVER" desc:"deliveries of one message before its worker gives up (executor: the call reports tool_internal_error; injector: the run fails with store_error)"`
	// Grace is how long in-flight work may run after shutdown begins before it is
	// cancelled (default DefaultGrace).
	Grace time.Duration `envconfig:"GRACE" desc:"shutdown grace period for in-flight work"`
	// Logger (default slog.Default()).
	Logger *slog.Logger `ignored:"true"`
}

// Validate reports the first field out of range as a *ConfigError (wrapping
// ErrInvalidConfig). Zero values are valid: they mean the default.
func (c WorkerConfig) Validate() error {
	switch {
	case c.Concurrency < 0:
		return InvalidField("Concurrency", c.Concurrency, fmt.Sprintf("1 or more (0: default %d)", DefaultConcurrency))
	case c.AckWait != 0 && c.AckWait < MinAckWait:
		return InvalidField("AckWait", c.AckWait, fmt.Sprintf("%v or more (0: default %v)", MinAckWait, DefaultAckWait))
	case c.MaxDeliver < 0:
		return InvalidField("MaxDeliver", c.MaxDeliver, fmt.Sprintf("1 or more (0: default %d)", DefaultMaxDeliver))
	case c.Grace < 0:
		return InvalidField("Grace", c.Grace, fmt.Sprintf("0s or more (0: default %v)", DefaultGrace))
	}
	return nil
}

// WithDefaults returns c with its zero fields set to their defaults; role is the
// Instance of a worker that names none.
func (c WorkerConfig) WithDefaults(role string) WorkerConfig {
	if c.Instance == "" {
		c.Instance = role
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
