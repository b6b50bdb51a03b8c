package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/telemetry"
)

// EnvConfig is what Serve reads from the environment: the same TOOLBUS_* variables as
// the toolbus binary's executor role, with the same logging, metrics, health and
// tracing (OTEL_*) settings.
type EnvConfig struct {
	connect.Options
	events.Config
	// WorkerConfig: TOOLBUS_INSTANCE (default host-pid), TOOLBUS_CONCURRENCY,
	// TOOLBUS_ACK_WAIT, TOOLBUS_MAX_DELIVER, TOOLBUS_GRACE (unset: the defaults of
	// package events).
	workerconfig.WorkerConfig
	// Settings: TOOLBUS_EXECUTOR_TOOLS, TOOLBUS_TEAM, TOOLBUS_EXECUTOR_REPLACE_CONTRACTS,
	// TOOLBUS_EXECUTOR_PROGRESS_INTERVAL, TOOLBUS_EXECUTOR_PARK_AFTER,
	// TOOLBUS_CALL_TIMEOUT, TOOLBUS_MAX_OUTPUT_BYTES: the binary's executor settings.
	Settings
	// MetricsAddr serves /metrics, /healthz and /readyz on host:port
	// (TOOLBUS_METRICS_ADDR), as the binary does; empty serves nothing.
	MetricsAddr string `envconfig:"METRICS_ADDR"`
	// LogLevel (TOOLBUS_LOG_LEVEL: debug, info, warn, error) and LogFormat
	// (TOOLBUS_LOG_FORMAT: text, json) make the logger, on stderr, unless Logger is set.
	LogLevel  string `envconfig:"LOG_LEVEL" default:"info"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"text"`
	// ServiceName names the process in traces unless OTEL_SERVICE_NAME does (default
	// toolbus-executor). Tracing is on when the OTEL_* variables ask for it, as in the
	// binary (telemetry.SetupTracing).
	ServiceName string `ignored:"true"`
}

// logger is the logger of cfg's level and format, on stderr.
func (c EnvConfig) logger() (*slog.Logger, error) {
	log, err := telemetry.NewLogger(c.LogLevel, c.LogFormat, os.Stderr)
	if err != nil {
		return nil, fmt.Errorf("executor: config: %w", err)
	}
	return log, nil
}

// LoadEnv reads EnvConfig from the TOOLBUS_* environment variables and validates the
// worker settings.
func LoadEnv() (EnvConfig, error) {
	var c EnvConfig
	if err := envconfig.Process(connect.EnvPrefix, &c); err != nil {
		return c, fmt.Errorf("executor: config: %w", err)
	}
	if err := c.WorkerConfig.Validate(); err != nil {
		return c, fmt.Errorf("executor: config: %w", err)
	}
	if err := c.Settings.validate(); err != nil {
		return c, err
	}
	if _, err := c.logger(); err != nil {
		return c, err
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
// publishes the tools to the catalog and runs calls until ctx ends, then drains. Like the
// binary, it logs at TOOLBUS_LOG_LEVEL in TOOLBUS_LOG_FORMAT, serves /metrics, /healthz
// and /readyz at TOOLBUS_METRICS_ADDR and exports traces when OTEL_* asks for them. opts
// configure the executor.Executor (WithAuthorizer, executor.WithLogger...).
func Serve(ctx context.Context, reg *executor.Registry, opts ...executor.Option) error {
	cfg, err := LoadEnv()
	if err != nil {
		return err
	}
	return ServeConfig(ctx, cfg, reg, opts...)
}

// ServeConfig is Serve with an explicit configuration (cfg.Logger, when set, replaces
// the logger of LogLevel and LogFormat).
func ServeConfig(ctx context.Context, cfg EnvConfig, reg *executor.Registry, opts ...executor.Option) error {
	if err := cfg.WorkerConfig.Validate(); err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		var err error
		if log, err = cfg.logger(); err != nil {
			return err
		}
	}
	shutdownTracing, err := telemetry.SetupTracing(ctx, cmp.Or(cfg.ServiceName, "toolbus-executor"))
	if err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(sctx); err != nil {
			log.Warn("spans not flushed", "error", err)
		}
	}()
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
	wcfg := cfg.Settings.Config(cfg.WorkerConfig)
	if cfg.MetricsAddr != "" {
		m := telemetry.New(telemetry.RoleExecutor)
		m.WatchQueues(bus, 0, log)
		if bus.TeamAccount() {
			m.QueuesOf(reg.Names) // a team account reads its own tools' queues, not the catalog
		}
		srv, err := telemetry.Listen(cfg.MetricsAddr, m.Handler(nc.IsConnected), log)
		if err != nil {
			return fmt.Errorf("executor: %w", err)
		}
		defer srv.Close() //nolint:errcheck // at exit
		wcfg.Metrics, wcfg.Observer = m, m.Observer("executor")
	}
	opts = append(append(cfg.Settings.ExecutorOptions(cfg.Instance, cfg.Options), executor.WithLogger(log)), opts...)
	exec, err := executor.New(reg, opts...)
	if err != nil {
		return err
	}
	wcfg.Logger = exec.Logger() // redacted as the executor redacts
	w, err := New(bus, exec, wcfg)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}
