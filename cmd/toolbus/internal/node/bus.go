package node

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

// Conn is an open connection to the bus, and the embedded server when the process runs
// one.
type Conn struct {
	// Server is the embedded server (nil: the process connected to TOOLBUS_NATS_URL).
	Server *embedded.Server
	// NC is the connection, and Bus the bus on it.
	NC  *nats.Conn
	Bus *events.Bus
}

// Close drains the connection and stops the embedded server.
func (c *Conn) Close() {
	if c.NC != nil {
		_ = c.NC.Drain()
		c.NC.Close()
	}
	if c.Server != nil {
		c.Server.Stop()
	}
}

// BusOf splits an opened connection into its bus and its Close (for a command whose
// logic lives in a package that takes a bus: toolbus audit export).
func BusOf(c *Conn, err error) (*events.Bus, func(), error) {
	if err != nil {
		return nil, nil, err
	}
	return c.Bus, c.Close, nil
}

// ErrNoURL: a process that must connect to a running server (a role, a command that
// publishes) found no TOOLBUS_NATS_URL.
var ErrNoURL = errors.New("TOOLBUS_NATS_URL is not set: this command connects to a running NATS server (set TOOLBUS_NATS_URL, or run the pipeline with `toolbus up`)")

// Open opens the bus: TOOLBUS_NATS_URL when set, else an embedded JetStream server
// with its file store in the data dir (only when embed is true).
func Open(ctx context.Context, cfg Config, log *slog.Logger, embed bool) (*Conn, error) {
	c := &Conn{}
	opts, err := cfg.NATSOptions("toolbus "+cfg.Instance, log)
	if err != nil {
		return nil, err
	}
	if cfg.URL != "" {
		c.NC, err = nats.Connect(cfg.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", cfg.URL, err)
		}
		log.Info("connected to NATS", "url", cfg.URL, "durability", "set by the server (sync_interval; deploy/nats/strict.conf fsyncs every write)")
	} else {
		if !embed {
			return nil, ErrNoURL
		}
		strict, err := cfg.SyncAlways()
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
		c.Server, err = embedded.Start(ecfg)
		if err != nil {
			return nil, err
		}
		log.Info("embedded JetStream server started", "url", c.Server.ClientURL(), "store", ecfg.StoreDir,
			"durability", durabilityName(c.Server.SyncAlways()))
		c.NC, err = c.Server.Connect(opts...)
		if err != nil {
			c.Server.Stop()
			return nil, err
		}
	}
	if c.Server != nil {
		// The embedded server's single user is admin: it sets the bus up itself.
		c.Bus, _, err = provision.Setup(ctx, c.NC, cfg.Config, SetupOptions(cfg)...)
	} else {
		// A running server was set up by `toolbus init`: bind to what exists.
		c.Bus, err = events.Open(ctx, c.NC, cfg.Config)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// durabilityName names the mode a server runs in, for logs.
func durabilityName(syncAlways bool) string {
	if syncAlways {
		return "strict (fsync every write)"
	}
	return "default (fsync every 2 min)"
}

// SetupOptions are the Setup options matching this configuration: the workers'
// consumers with the settings the workers will bind with.
func SetupOptions(cfg Config) []provision.Option {
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
