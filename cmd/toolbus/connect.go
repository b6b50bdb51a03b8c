package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
)

// conn is an open connection to the bus, and the embedded server when toolbus runs one.
type conn struct {
	srv *embedded.Server
	nc  *nats.Conn
	bus *events.Bus
}

func (c *conn) Close() {
	if c.nc != nil {
		_ = c.nc.Drain()
		c.nc.Close()
	}
	if c.srv != nil {
		c.srv.Stop()
	}
}

// openBus opens the bus: TOOLBUS_NATS_URL when set, else an embedded JetStream server
// with its file store in the data dir (only when embed is true).
func openBus(ctx context.Context, cfg Config, log *slog.Logger, embed bool) (*conn, error) {
	c := &conn{}
	opts, err := cfg.NATSOptions("toolbus "+cfg.Instance, log)
	if err != nil {
		return nil, err
	}
	if cfg.URL != "" {
		c.nc, err = nats.Connect(cfg.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", cfg.URL, err)
		}
		log.Info("connected to NATS", "url", cfg.URL, "durability", "set by the server (sync_interval; deploy/nats/strict.conf fsyncs every write)")
	} else {
		if !embed {
			return nil, fmt.Errorf("TOOLBUS_NATS_URL is not set: this role connects to a running NATS server (or use `toolbus up`)")
		}
		strict, err := cfg.syncAlways()
		if err != nil {
			return nil, err
		}
		ecfg := embedded.Config{Port: -1, StoreDir: filepath.Join(cfg.DataDir, "jetstream"), ServerName: "toolbus-embedded", SyncAlways: strict}
		if cfg.Listen != "" {
			host, port, err := splitHostPort(cfg.Listen)
			if err != nil {
				return nil, err
			}
			ecfg.Host, ecfg.Port = host, port
		}
		if err := os.MkdirAll(ecfg.StoreDir, 0o755); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
		c.srv, err = embedded.Start(ecfg)
		if err != nil {
			return nil, err
		}
		log.Info("embedded JetStream server started", "url", c.srv.ClientURL(), "store", ecfg.StoreDir,
			"durability", durabilityName(c.srv.SyncAlways()))
		c.nc, err = c.srv.Connect(opts...)
		if err != nil {
			c.srv.Stop()
			return nil, err
		}
	}
	if c.srv != nil {
		// The embedded server's single user is admin: it sets the bus up itself.
		c.bus, _, err = provision.Setup(ctx, c.nc, cfg.Config, setupOptions(cfg)...)
	} else {
		// A running server was set up by `toolbus init`: bind to what exists.
		c.bus, err = events.Open(ctx, c.nc, cfg.Config)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// errNoStore: a read-only command found neither TOOLBUS_NATS_URL nor a local store.
var errNoStore = errors.New("nothing to read")

// openReader opens the bus for a command that only reads (runs, tools, replay, console):
// TOOLBUS_NATS_URL, else the local store of the embedded server, which must exist: a
// read-only command never creates ./data.
func openReader(ctx context.Context, cfg Config, log *slog.Logger) (*conn, error) {
	if cfg.URL == "" {
		store := filepath.Join(cfg.DataDir, "jetstream")
		if _, err := os.Stat(store); err != nil {
			return nil, &exitError{code: 1, msg: fmt.Sprintf("%v: TOOLBUS_NATS_URL is not set and there is no local store in %s (start toolbus up, or set TOOLBUS_NATS_URL)",
				errNoStore, store)}
		}
	}
	return openBus(ctx, cfg, log, true)
}

// durabilityName names the mode a server runs in, for logs.
func durabilityName(syncAlways bool) string {
	if syncAlways {
		return "strict (fsync every write)"
	}
	return "default (fsync every 2 min)"
}

// setupOptions are the Setup options matching this configuration: the workers'
// consumers with the settings the workers will bind with.
func setupOptions(cfg Config) []provision.Option {
	return []provision.Option{
		provision.WithWorkers(provision.RolePlanner, provision.WorkerSettings{AckWait: cfg.AckWait, Concurrency: cfg.Concurrency}),
		provision.WithWorkers(provision.RoleInjector, provision.WorkerSettings{AckWait: cfg.AckWait, Concurrency: cfg.Concurrency}),
	}
}

func splitHostPort(s string) (string, int, error) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ':' {
			p, err := strconv.Atoi(s[i+1:])
			if err != nil {
				return "", 0, fmt.Errorf("TOOLBUS_LISTEN %q: bad port", s)
			}
			return s[:i], p, nil
		}
	}
	return "", 0, fmt.Errorf("TOOLBUS_LISTEN %q: want host:port", s)
}
