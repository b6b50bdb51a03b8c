package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sourcegraph/conc"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/bench"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/models"
	"github.com/toolbus/toolbus/reads"
	"github.com/toolbus/toolbus/telemetry"
)

// role is one worker of the pipeline.
// tel is nil when metrics are off.
type role func(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, tel *telemetry.Metrics) error

var roles = map[string]role{
	"planner":  runPlanner,
	"executor": runExecutor,
	"injector": runInjector,
}

// RunRoles runs the named roles on one bus until ctx ends; the first failure stops all.
func RunRoles(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, names ...string) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tel, stopTel, err := startTelemetry(cfg, bus, log, names)
	if err != nil {
		return err
	}
	defer stopTel()
	service := "toolbus"
	if len(names) == 1 {
		service += "-" + names[0]
	}
	shutdownTracing, err := telemetry.SetupTracing(ctx, service)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(sctx); err != nil {
			log.Warn("spans not flushed", "error", err)
		}
	}()
	// A connection closed for good (a revoked credential) stops every role, /healthz
	// failing and the process exiting non-zero with the reason (connect.WatchClosed);
	// the executor, also run as a library (worker.Serve), watches on its own.
	var failer connect.Failer
	if tel != nil {
		failer = tel
	}
	ctx, stopWatch := connect.WatchClosed(ctx, bus.Conn(), strings.Join(names, "+"), failer, func(err error) {
		log.Error("stopping: this process cannot work", "roles", names, "error", err)
	})
	defer stopWatch()
	// Every role registers before any starts: /readyz waits for all of them.
	for _, name := range names {
		serveObserver(tel, name)
	}
	var wg conc.WaitGroup
	errs := make(chan error, len(names))
	for _, name := range names {
		r := roles[name]
		wg.Go(func() {
			if err := r(ctx, cfg, bus, log, tel); err != nil {
				if parent.Err() != nil && errors.Is(err, context.Canceled) {
					return // stopped (a signal) while starting up: a shutdown, not a failure
				}
				errs <- roleError(name, err)
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if cause := context.Cause(ctx); errors.Is(cause, connect.ErrConnectionClosed) {
		return cause // the roles stopped as on a shutdown: say why
	}
	return nil
}

// roleError names the role that failed, once: not "planner: planner: ...".
func roleError(name string, err error) error {
	if strings.HasPrefix(err.Error(), name+":") {
		return err
	}
	return fmt.Errorf("%s: %w", name, err)
}

// worker is the shared worker settings of every role, logging to log.
// DecisionPolicy is the injector's Deciders: TOOLBUS_DECIDERS, or when it is unset,
// anyone on the embedded server (its one process is one party) and only each run's
// principal and approvers on a shared server, where clients must not decide on each
// other's runs.
func (c Config) DecisionPolicy() []string {
	if c.Deciders == nil && c.URL != "" {
		return []string{}
	}
	return c.Deciders
}

func (c Config) worker(log *slog.Logger) workerconfig.WorkerConfig {
	wc := c.WorkerConfig
	wc.Logger = log
	return wc
}

// NewRegistry is the registry of the built-in tool packs of TOOLBUS_TOOLS.
func NewRegistry(cfg Config) (*executor.Registry, error) {
	reg := executor.NewRegistry()
	if err := packs.Register(reg, cfg.packs()...); err != nil {
		return nil, err
	}
	return reg, nil
}

func runExecutor(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, tel *telemetry.Metrics) error {
	reg, err := NewRegistry(cfg)
	if err != nil {
		return err
	}
	if bus.TeamAccount() {
		tel.QueuesOf(reg.Names) // a team account reads its own tools' queues, not the catalog
	}
	exec, err := executor.New(reg, append(cfg.Settings.ExecutorOptions(cfg.Instance, cfg.Options), executor.WithLogger(log))...)
	if err != nil {
		return err
	}
	// The worker and the MCP servers log what the executor does: redacted alike.
	log = exec.Logger()
	wcfg := cfg.Settings.Config(cfg.worker(log))
	wcfg.Metrics, wcfg.Observer = executorMetrics(tel), serveObserver(tel, "executor")
	w, err := worker.New(bus, exec, wcfg)
	if err != nil {
		return err
	}
	if cfg.MCPConfig != "" {
		mc, err := mcptools.LoadConfig(cfg.MCPConfig)
		if err != nil {
			return err
		}
		// The MCP tools are registered before the worker starts, so they enter the
		// catalog with the packs; later tool list changes reach it through Sync.
		mo := mcptools.Options{Logger: log, OnChange: w.Sync, OnSecret: exec.AddSecrets}
		if mc.OAuth() {
			// The servers' tokens are shared by the deployment's executors of the team.
			if sec, err := bus.Secrets(ctx, wcfg.Team); err != nil {
				log.Warn("OAuth tokens of MCP servers not shared: each executor takes its own", "error", err)
			} else {
				mo.Tokens = sec
			}
		}
		p, err := mcptools.New(reg, mc, mo)
		if err != nil {
			return err
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
		defer p.Close()
		log.Info("MCP servers connected", "servers", len(mc.MCPServers), "tools", p.Tools())
	}
	return w.Run(ctx)
}

func runPlanner(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, tel *telemetry.Metrics) error {
	model, err := models.New(cfg.Model, cfg.ModelOptions())
	if err != nil {
		return err
	}
	cat, err := bus.Store().WatchCatalog(ctx, log)
	if err != nil {
		return err
	}
	p, err := planner.New(bus, model, cat, planner.Config{
		WorkerConfig: cfg.worker(log), Defaults: cfg.DefaultLimits(), MaxCallsPerStep: cfg.MaxCallsPerStep, MaxAnswerBytes: cfg.MaxAnswerBytes,
		Metrics: plannerMetrics(tel), Observer: serveObserver(tel, "planner"),
		Models: models.NewSet(cfg.Model, model, cfg.ModelOptions()).Resolve,
	})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

func runInjector(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, tel *telemetry.Metrics) error {
	in, err := injector.New(bus, injector.Config{
		WorkerConfig: cfg.worker(log), Rules: injector.Rules{FailOn: cfg.FailOn}, Defaults: cfg.DefaultLimits(),
		Metrics: injectorMetrics(tel), Observer: serveObserver(tel, "injector"), Deciders: cfg.DecisionPolicy(),
		Quota: injector.Quota{MaxRunsInFlight: cfg.MaxRunsInFlight, StartsPerSecond: cfg.StartsPerSecond, MaxStartBytes: cfg.MaxStartBytes},
	})
	if err != nil {
		return err
	}
	// The read and write services live as long as the injector: they stop (draining)
	// when the injector does, and a failure of their own ends nothing but themselves.
	rctx, stop := context.WithCancel(ctx)
	var wg conc.WaitGroup
	if cfg.ReadService {
		wg.Go(func() {
			if err := reads.New(bus, log).Serve(rctx); err != nil {
				log.Warn("read service stopped", "err", err)
			}
		})
	}
	if cfg.WriteService {
		// Checked with the configuration (Config.Validate): no error here.
		buckets, _ := intake.BucketBounds(cfg.TenantBucketKeys, cfg.TenantValueBytes)
		lim := intake.Limits{BytesPerSecond: cfg.TenantBytesPerSecond, Burst: cfg.TenantBytesBurst, MaxStartBytes: cfg.MaxStartBytes, Buckets: buckets,
			ClaimsShare: intake.StreamShare{Bytes: cfg.TenantClaimsBytes, Window: bus.Config().MaxAge}}
		if es := bus.EventStream(); es != nil && es.CachedInfo() != nil {
			sc := es.CachedInfo().Config
			lim.StreamShare = intake.StreamShareOf(sc.MaxBytes, cfg.TenantStreamShare, sc.MaxAge)
		}
		svc := intake.New(bus.Conn(), lim, log)
		if tel != nil {
			svc.Observe(tel)
		}
		wg.Go(func() {
			if err := svc.Serve(rctx); err != nil {
				log.Warn("write service stopped", "err", err)
			}
		})
	}
	startCheckpoints(rctx, bus, log, tel, &wg)
	if err := startFair(rctx, cfg, bus, log, &wg); err != nil {
		stop()
		wg.Wait()
		return err
	}
	err = in.Run(ctx)
	stop()
	wg.Wait()
	return err
}

// ModelOptions build the models of TOOLBUS_MODEL and of the runs that name one; the
// benchmark's noop script (script:noop) is built in too.
func (c Config) ModelOptions() models.Options {
	return models.Options{Logger: c.Logger(), Record: c.Record, Scripts: map[string]func() planner.Model{
		"noop": func() planner.Model { return bench.NoopScript(4, 3) },
	}}
}

// StartInProcess runs the executor, planner and injector on the embedded bus of c until
// the returned stop is called, once the executor has published its tools.
func StartInProcess(ctx context.Context, cfg Config, c *Conn, log *slog.Logger) (stop func(), err error) {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- RunRoles(wctx, cfg, c.Bus, log, "executor", "planner", "injector") }()
	stop = func() {
		cancel()
		<-done
	}
	if err := WaitForCatalog(ctx, c.Bus, done); err != nil {
		cancel()
		return nil, err
	}
	return stop, nil
}

// WaitForCatalog waits until the in-process executor has published its tools, so the
// first model request sees them.
// A worker that fails meanwhile (workersDone) is the error, not the missing tools.
func WaitForCatalog(ctx context.Context, bus *events.Bus, workersDone <-chan error) error {
	cat, err := bus.Store().WatchCatalog(ctx, nil)
	if err != nil {
		return err
	}
	for i := 0; i < 500; i++ {
		if _, ok := cat.Lookup("noop"); ok || len(cat.Tools(nil)) > 0 {
			return nil
		}
		select {
		case err := <-workersDone:
			if err == nil {
				err = errors.New("the workers stopped")
			}
			return fmt.Errorf("run: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return errors.New("run: no executor published its tools")
}
