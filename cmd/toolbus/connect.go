package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
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
	} else {
		if !embed {
			return nil, fmt.Errorf("TOOLBUS_NATS_URL is not set: this role connects to a running NATS server (or use `toolbus up`)")
		}
		ecfg := embedded.Config{Port: -1, StoreDir: filepath.Join(cfg.DataDir, "jetstream"), ServerName: "toolbus-embedded"}
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
		log.Info("embedded JetStream server started", "url", c.srv.ClientURL(), "store", ecfg.StoreDir)
		c.nc, err = c.srv.Connect(opts...)
		if err != nil {
			c.srv.Stop()
			return nil, err
		}
	}
	c.bus, err = events.Open(ctx, c.nc, cfg.Config)
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
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
