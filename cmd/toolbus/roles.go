package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/sourcegraph/conc"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// role is one worker of the pipeline.
type role func(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger) error

var roles = map[string]role{
	"planner":  runPlanner,
	"executor": runExecutor,
	"injector": runInjector,
}

// runRoles runs the named roles on one bus until ctx ends; the first failure stops all.
func runRoles(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger, names ...string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg conc.WaitGroup
	errs := make(chan error, len(names))
	for _, name := range names {
		r := roles[name]
		wg.Go(func() {
			if err := r(ctx, cfg, bus, log); err != nil {
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

func newRegistry(cfg Config) (*executor.Registry, error) {
	reg := executor.NewRegistry()
	if err := packs.Register(reg, cfg.packs()...); err != nil {
		return nil, err
	}
	return reg, nil
}

func runExecutor(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger) error {
	reg, err := newRegistry(cfg)
	if err != nil {
		return err
	}
	exec := executor.New(reg, executor.WithLogger(log), executor.WithInstance(cfg.Instance),
		executor.WithDefaultTimeout(cfg.CallTimeout), executor.WithDefaultMaxOutputBytes(cfg.MaxOutput))
	w := executor.NewWorker(bus, exec, executor.WorkerConfig{
		Instance: cfg.Instance, Concurrency: cfg.Concurrency, Tools: cfg.ExecutorTools,
		AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver, Grace: cfg.Grace, Logger: log,
	})
	return w.Run(ctx)
}

func runPlanner(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger) error {
	model, err := newModel(cfg)
	if err != nil {
		return err
	}
	cat, err := bus.WatchCatalog(ctx, log)
	if err != nil {
		return err
	}
	p := planner.New(bus, model, cat, planner.Config{
		Instance: cfg.Instance, Concurrency: cfg.Concurrency, Grace: cfg.Grace, Logger: log, AckWait: cfg.AckWait,
		Defaults: cfg.defaultLimits(), MaxCallsPerStep: cfg.MaxCallsPerStep,
	})
	return p.Run(ctx)
}

func runInjector(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger) error {
	in := injector.New(bus, injector.Config{
		Instance: cfg.Instance, Concurrency: cfg.Concurrency, Grace: cfg.Grace, Logger: log, AckWait: cfg.AckWait,
		Rules: injector.Rules{FailOn: cfg.FailOn, MaxSteps: cfg.MaxSteps}, Defaults: cfg.defaultLimits(),
	})
	return in.Run(ctx)
}
