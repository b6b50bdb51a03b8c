package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
)

// EnvConfig is what Serve reads from the environment: the same TOOLBUS_* variables as
// the toolbus binary's executor role.
type EnvConfig struct {
	connect.Options
	events.Config
	// Instance names this process (TOOLBUS_INSTANCE; default host-pid).
	Instance string `envconfig:"INSTANCE"`
	// Concurrency is the most calls run at once (TOOLBUS_CONCURRENCY).
	Concurrency int `envconfig:"CONCURRENCY" default:"64"`
	// Tools limits the process to these tools of the registry (TOOLBUS_EXECUTOR_TOOLS).
	Tools       []string      `envconfig:"EXECUTOR_TOOLS"`
	AckWait     time.Duration `envconfig:"ACK_WAIT" default:"30s"`
	MaxDeliver  int           `envconfig:"MAX_DELIVER" default:"5"`
	Grace       time.Duration `envconfig:"GRACE" default:"30s"`
	CallTimeout time.Duration `envconfig:"CALL_TIMEOUT" default:"30s"`
	MaxOutput   int           `envconfig:"MAX_OUTPUT_BYTES" default:"16384"`
}

// LoadEnv reads EnvConfig from the TOOLBUS_* environment variables.
func LoadEnv() (EnvConfig, error) {
	var c EnvConfig
	if err := envconfig.Process(connect.EnvPrefix, &c); err != nil {
		return c, fmt.Errorf("executor: config: %w", err)
	}
	if c.Instance == "" {
		h, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	return c, nil
}

// Serve runs an executor of your own: it connects to the bus from the TOOLBUS_*
// environment (TOOLBUS_NATS_URL and credentials, as the toolbus binary does), joins the
// queue of every tool in reg (shared with every other process serving the same tool),
// publishes the tools to the catalog and runs calls until ctx ends, then drains. opts
// configure the executor.Executor (WithAuthorizer, executor.WithLogger...).
func Serve(ctx context.Context, reg *executor.Registry, opts ...executor.Option) error {
	cfg, err := LoadEnv()
	if err != nil {
		return err
	}
	return ServeConfig(ctx, cfg, reg, opts...)
}

// ServeConfig is Serve with an explicit configuration.
func ServeConfig(ctx context.Context, cfg EnvConfig, reg *executor.Registry, opts ...executor.Option) error {
	log := slog.Default()
	nc, err := connect.Dial(ctx, cfg.Options, "toolbus executor "+cfg.Instance, log)
	if err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	defer func() {
		_ = nc.Drain()
		nc.Close()
	}()
	bus, err := events.Open(ctx, nc, cfg.Config)
	if err != nil {
		return err
	}
	opts = append([]executor.Option{executor.WithInstance(cfg.Instance), executor.WithDefaultTimeout(cfg.CallTimeout),
		executor.WithDefaultMaxOutputBytes(cfg.MaxOutput), executor.WithLogger(log)}, opts...)
	exec := executor.New(reg, opts...)
	w := New(bus, exec, Config{
		Instance: cfg.Instance, Concurrency: cfg.Concurrency, Tools: cfg.Tools, AckWait: cfg.AckWait,
		MaxDeliver: cfg.MaxDeliver, Grace: cfg.Grace, Logger: log,
	})
	return w.Run(ctx)
}
