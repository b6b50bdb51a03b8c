package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/executor/mcptools"
)

// cmdInit (admin) creates or updates the stream, the buckets, the read mirror and the
// durable consumers of every role on the server of TOOLBUS_NATS_URL, so workers with
// least-privilege credentials only bind to them. It is idempotent and prints what it
// created, updated or found unchanged.
func cmdInit(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("init", "init [--tools a,b] [--read-mirror=false]   (admin credentials; TOOLBUS_NATS_URL must be set)", errOut)
	tools := fs.String("tools", "", "comma-separated tools whose queue consumers to create (default: TOOLBUS_EXECUTOR_TOOLS, else every tool of the TOOLBUS_TOOLS packs and of the MCP servers of TOOLBUS_MCP_CONFIG)")
	mirror := fs.Bool("read-mirror", true, "create the read mirror of the stream, where readers (run, tail, replay) create their consumers")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return &exitError{code: 2, msg: "init: unexpected arguments " + strings.Join(fs.Args(), " ")}
	}
	if cfg.URL == "" {
		return &exitError{code: 2, msg: "init: TOOLBUS_NATS_URL is not set (the embedded server of `toolbus up` sets itself up)"}
	}
	names, err := initTools(ctx, cfg, *tools, log)
	if err != nil {
		return &exitError{code: 2, msg: "init: " + err.Error()}
	}
	opts, err := cfg.NATSOptions("toolbus init", log)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return fmt.Errorf("init: connect %s: %w", cfg.URL, err)
	}
	defer nc.Close()
	setup := append(node.SetupOptions(cfg), provision.WithTools(names, cfg.AckWait, 0))
	if *mirror {
		setup = append(setup, provision.WithReadMirror())
	}
	_, changes, err := provision.Setup(ctx, nc, cfg.Config, setup...)
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	for _, c := range changes {
		fmt.Fprintln(out, c)
	}
	return nil
}

// initTools is the list of tools whose queue consumers init creates: --tools, else
// TOOLBUS_EXECUTOR_TOOLS, else every tool the executors of this configuration serve:
// those of the TOOLBUS_TOOLS packs and of the MCP servers of TOOLBUS_MCP_CONFIG (init
// starts them, lists their tools and stops them).
func initTools(ctx context.Context, cfg Config, flagTools string, log *slog.Logger) ([]string, error) {
	var names []string
	for _, t := range strings.Split(flagTools, ",") {
		if t = strings.TrimSpace(t); t != "" {
			names = append(names, t)
		}
	}
	if len(names) == 0 {
		names = cfg.ExecutorTools
	}
	if len(names) == 0 {
		reg, err := node.NewRegistry(cfg)
		if err != nil {
			return nil, err
		}
		if cfg.MCPConfig != "" {
			mc, err := mcptools.LoadConfig(cfg.MCPConfig)
			if err != nil {
				return nil, err
			}
			p, err := mcptools.New(reg, mc, mcptools.Options{Logger: log})
			if err != nil {
				return nil, err
			}
			err = p.Start(ctx)
			p.Close()
			if err != nil {
				return nil, fmt.Errorf("TOOLBUS_MCP_CONFIG %s: %w", cfg.MCPConfig, err)
			}
		}
		names = reg.Names()
	}
	for _, t := range names {
		if !toolbus.ValidToolName(t) {
			return nil, fmt.Errorf("invalid tool name %q", t)
		}
	}
	return names, nil
}
