package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sourcegraph/conc"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
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

// runRoles runs the named roles on one bus until ctx ends; the first failure stops all.
func runRoles(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, names ...string) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tel, stopTel, err := startTelemetry(cfg, bus, log)
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
	return <-errs
}

// roleError names the role that failed, once: not "planner: planner: ...".
func roleError(name string, err error) error {
	if strings.HasPrefix(err.Error(), name+":") {
		return err
	}
	return fmt.Errorf("%s: %w", name, err)
}

// worker is the shared worker settings of every role, logging to log.
func (c Config) worker(log *slog.Logger) events.WorkerConfig {
	wc := c.WorkerConfig
	wc.Logger = log
	return wc
}

func newRegistry(cfg Config) (*executor.Registry, error) {
	reg := executor.NewRegistry()
	if err := packs.Register(reg, cfg.packs()...); err != nil {
		return nil, err
	}
	return reg, nil
}

func runExecutor(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, tel *telemetry.Metrics) error {
	reg, err := newRegistry(cfg)
	if err != nil {
		return err
	}
	exec, err := executor.New(reg, executor.WithLogger(log), executor.WithInstance(cfg.Instance),
		executor.WithDefaultTimeout(cfg.CallTimeout), executor.WithDefaultMaxOutputBytes(cfg.MaxOutput),
		executor.WithSecrets(cfg.secretValues()...))
	if err != nil {
		return err
	}
	w, err := worker.New(bus, exec, worker.Config{
		WorkerConfig: cfg.worker(log), Tools: cfg.ExecutorTools, Team: cfg.Team, ReplaceContracts: cfg.ReplaceContracts,
		ProgressInterval: cfg.ProgressInterval,
		Metrics:          executorMetrics(tel), Observer: serveObserver(tel, "executor"),
	})
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
		p, err := mcptools.New(reg, mc, mcptools.Options{Logger: log, OnChange: w.Sync})
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
	model, err := newModel(cfg)
	if err != nil {
		return err
	}
	cat, err := bus.Store().WatchCatalog(ctx, log)
	if err != nil {
		return err
	}
	p, err := planner.New(bus, model, cat, planner.Config{
		WorkerConfig: cfg.worker(log), Defaults: cfg.defaultLimits(), MaxCallsPerStep: cfg.MaxCallsPerStep, MaxAnswerBytes: cfg.MaxAnswerBytes,
		Metrics: plannerMetrics(tel), Observer: serveObserver(tel, "planner"),
		Models: newModelSet(cfg, model).resolve,
	})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

func runInjector(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, tel *telemetry.Metrics) error {
	in, err := injector.New(bus, injector.Config{
		WorkerConfig: cfg.worker(log), Rules: injector.Rules{FailOn: cfg.FailOn}, Defaults: cfg.defaultLimits(),
		Metrics: injectorMetrics(tel), Observer: serveObserver(tel, "injector"),
	})
	if err != nil {
		return err
	}
	return in.Run(ctx)
}
