package main

import (
	"context"
	"log/slog"

	"github.com/toolbus/toolbus/console"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/door"
)

// The web console lives in package console; this wires it from the configuration.

// cmdConsole serves the console at TOOLBUS_CONSOLE_ADDR.
func cmdConsole(ctx context.Context, cfg Config, log *slog.Logger) error {
	if cfg.ConsoleAddr == "" {
		return &exitError{code: 2, msg: "console: set TOOLBUS_CONSOLE_ADDR (host:port), for example 127.0.0.1:8080"}
	}
	if _, err := consoleOptionsOf(cfg); err != nil {
		return err
	}
	c, err := openReader(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Bus.ClientAccount() && (cfg.ConsolePublicRead || cfg.ConsoleUsers == "" && cfg.ConsoleUsersFile == "") {
		return &exitError{code: 1, msg: "console: on a client account's credentials (TOOLBUS_NATS_READ_PREFIX) each user reads and acts as their own identity, so it needs users (TOOLBUS_CONSOLE_USERS_FILE, named after the identities the account is bound to) and no public reads"}
	}
	return runConsole(ctx, cfg, c.Bus, log)
}

// consoleOptionsOf reads the console's users and settings; the console needs users
// unless it is explicitly public and read-only.
func consoleOptionsOf(cfg Config) (console.Options, error) {
	listen, _, err := door.LoopbackAddr(cfg.ConsoleAddr)
	if err != nil {
		return console.Options{}, &exitError{code: 2, msg: "console: TOOLBUS_CONSOLE_ADDR " + err.Error()}
	}
	opts := console.Options{PublicRead: cfg.ConsolePublicRead, Listen: listen, AllowedHosts: cfg.ConsoleAllowedHosts, Instance: cfg.Instance, Deciders: cfg.DecisionPolicy()}
	if cfg.ConsoleUsers == "" && cfg.ConsoleUsersFile == "" {
		if !cfg.ConsolePublicRead {
			return opts, &exitError{code: 2, msg: "console: set TOOLBUS_CONSOLE_USERS_FILE (who may sign in; `toolbus token NAME` makes an entry), or TOOLBUS_CONSOLE_PUBLIC_READ=true for a read-only console anyone who reaches it can read"}
		}
		return opts, nil
	}
	if opts.Users, err = door.NewSource(cfg.ConsoleUsers, cfg.ConsoleUsersFile); err != nil {
		return opts, &exitError{code: 2, msg: "console: " + err.Error()}
	}
	return opts, nil
}

// runConsole serves the console of bus at TOOLBUS_CONSOLE_ADDR until ctx ends.
func runConsole(ctx context.Context, cfg Config, bus *events.Bus, log *slog.Logger) error {
	opts, err := consoleOptionsOf(cfg)
	if err != nil {
		return err
	}
	h, err := console.New(ctx, bus, opts, log)
	if err != nil {
		return err
	}
	if opts.Users == nil {
		log.Warn("console is public and read-only: anyone who reaches it reads every run; set TOOLBUS_CONSOLE_USERS_FILE to require sign-in and to act")
	} else if opts.PublicRead {
		log.Warn("console reads are public (TOOLBUS_CONSOLE_PUBLIC_READ): anyone who reaches it reads every run")
	}
	if _, beyond, _ := door.LoopbackAddr(cfg.ConsoleAddr); beyond {
		log.Warn("console listens beyond this machine: serve it behind TLS and set TOOLBUS_CONSOLE_ALLOWED_HOSTS to the names users reach it by", "addr", opts.Listen)
	}
	return console.Serve(ctx, opts.Listen, h, log)
}
