// Package embedded starts an in-process NATS server with JetStream: the default of
// `toolbus up` when no TOOLBUS_NATS_URL is set, and the server of every test.
package embedded

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ErrNotReady is returned when the server does not accept connections in time.
var ErrNotReady = errors.New("embedded: nats server not ready")

// Config configures an embedded server.
type Config struct {
	// Host and Port to listen on; Port -1 picks a random free port, 0 the NATS default 4222.
	Host string
	Port int
	// StoreDir is where JetStream keeps its file store.
	StoreDir string
	// MaxPayload in bytes; 0 keeps the NATS default (1 MiB).
	MaxPayload int32
	// ServerName names the server (useful in logs).
	ServerName string
	// Logs sends the server's own logs to stderr.
	Logs bool
	// SyncAlways makes the file store fsync every write before acknowledging it
	// (`sync_interval: always`): an acknowledged event survives a power loss, at about
	// half a millisecond per write. By default the server syncs every 2 minutes and an
	// acknowledged event survives a crash of the process, not of the machine.
	SyncAlways bool
}

// Server is a running embedded server.
type Server struct {
	*server.Server
	lock *storeLock
}

// Start starts a JetStream-enabled server and waits until it accepts connections. The
// store directory is this process's until Stop (or its end): Start refuses a directory
// whose server runs in another process, with an *InUseError naming it and its URL.
func Start(cfg Config) (*Server, error) {
	var lock *storeLock
	if cfg.StoreDir != "" {
		var err error
		if lock, err = lockStore(cfg.StoreDir); err != nil {
			return nil, err
		}
	}
	srv, err := start(cfg)
	if err != nil {
		lock.release()
		return nil, err
	}
	if lock != nil {
		h := Holder{PID: os.Getpid(), URL: srv.ClientURL(), Command: strings.Join(os.Args, " ")}
		if err := lock.write(h); err != nil {
			srv.Shutdown()
			lock.release()
			return nil, err
		}
	}
	return &Server{Server: srv, lock: lock}, nil
}

func start(cfg Config) (*server.Server, error) {
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		MaxPayload: cfg.MaxPayload,
		NoLog:      !cfg.Logs,
		SyncAlways: cfg.SyncAlways,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: new server: %w", err)
	}
	if cfg.Logs {
		srv.ConfigureLogger()
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, ErrNotReady
	}
	return srv, nil
}

// SyncAlways reports whether the running JetStream fsyncs every write (the setting its
// file stores were given, read back from the server).
func (s *Server) SyncAlways() bool {
	jsc := s.JetStreamConfig()
	return jsc != nil && jsc.SyncAlways
}

// Connect opens a client connection to the server without a socket (in-process), which
// halves the latency of loopback TCP.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(s.Server)}, opts...)
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded: connect: %w", err)
	}
	return nc, nil
}

// Stop shuts the server down and waits for it.
func (s *Server) Stop() {
	s.Shutdown()
	s.WaitForShutdown()
	s.lock.release()
}
