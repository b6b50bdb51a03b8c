package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

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

func (c Config) natsOptions(log *slog.Logger) []nats.Option {
	opts := []nats.Option{
		nats.Name("toolbus " + c.Instance),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }),
	}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.NKeySeed != "" {
		if o, err := nats.NkeyOptionFromSeed(c.NKeySeed); err == nil {
			opts = append(opts, o)
		} else {
			log.Error("nkey seed", "error", err)
		}
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.Token != "" {
		opts = append(opts, nats.Token(c.Token))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	return opts
}

// connect opens the bus: TOOLBUS_NATS_URL when set, else an embedded JetStream server
// with its file store in the data dir (only when embed is true).
func connect(ctx context.Context, cfg Config, log *slog.Logger, embed bool) (*conn, error) {
	c := &conn{}
	var err error
	if cfg.NatsURL != "" {
		c.nc, err = nats.Connect(cfg.NatsURL, cfg.natsOptions(log)...)
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", cfg.NatsURL, err)
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
		c.nc, err = c.srv.Connect(cfg.natsOptions(log)...)
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
