package main

import (
	"context"
	"log/slog"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
)

// cmdUp runs all three roles in this process, on an embedded server unless
// TOOLBUS_NATS_URL is set.
func cmdUp(ctx context.Context, cfg Config, log *slog.Logger) error {
	c, err := node.Open(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer c.Close()
	log.Info("toolbus up", "instance", cfg.Instance, "stream", c.Bus.Config().Stream)
	if cfg.ConsoleAddr != "" {
		// The console lives and dies with the workers.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		consoleErr := make(chan error, 1)
		go func() {
			err := runConsole(ctx, cfg, c.Bus, log)
			if err != nil {
				cancel() // a console that cannot serve stops up, as a role would
			}
			consoleErr <- err
		}()
		err := node.RunRoles(ctx, cfg, c.Bus, log, "executor", "planner", "injector")
		cancel()
		if cerr := <-consoleErr; err == nil {
			err = cerr
		}
		return err
	}
	return node.RunRoles(ctx, cfg, c.Bus, log, "executor", "planner", "injector")
}

// cmdRole runs one role against TOOLBUS_NATS_URL.
func cmdRole(ctx context.Context, cfg Config, log *slog.Logger, name string) error {
	c, err := node.Open(ctx, cfg, log, false)
	if err != nil {
		return err
	}
	defer c.Close()
	return node.RunRoles(ctx, cfg, c.Bus, log, name)
}
