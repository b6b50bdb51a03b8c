package embedded

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

// Configured is a NATS server run from a configuration file (toolbus server): the
// file and what overrides it.
type Configured struct {
	Config, StoreDir, Host string
	Port                   int
	// Monitor is the monitoring port: "" as the file says, "0" none.
	Monitor string
	Debug   bool
}

// ConfiguredOptions reads f.Config and applies f's overrides over it.
func ConfiguredOptions(f Configured) (*server.Options, error) {
	opts, err := server.ProcessConfigFile(f.Config)
	if err != nil {
		return nil, fmt.Errorf("server: configuration %s: %s", f.Config, strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; "))
	}
	if f.StoreDir != "" {
		opts.StoreDir = f.StoreDir
	}
	if f.Host != "" {
		opts.Host = f.Host
	}
	if f.Port != 0 {
		opts.Port = f.Port
	}
	if f.Monitor != "" {
		port, err := strconv.Atoi(f.Monitor)
		if err != nil || port < 0 || port > 65535 {
			return nil, fmt.Errorf("server: -m %q: want a port number", f.Monitor)
		}
		opts.HTTPPort = port
	}
	if f.Debug {
		opts.Debug = true
	}
	// Timestamped log lines, as nats-server's -T (on by default there).
	opts.Logtime = true
	// This command handles the signals (serve): the library's handler exits the process.
	opts.NoSigs = true
	if opts.JetStream && opts.StoreDir == "" {
		// The library would store in a temporary directory, lost on a reboot.
		return nil, fmt.Errorf("server: configuration %s enables JetStream with no store_dir: give the directory with -sd DIR", f.Config)
	}
	return opts, nil
}

// ServeConfigured runs the server of opts (ConfiguredOptions) until ctx ends (SIGINT, SIGTERM) or it shuts down, reloading
// the configuration on SIGHUP.
func ServeConfigured(ctx context.Context, opts *server.Options, f Configured) error {
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("server: configuration %s: %w", f.Config, err)
	}
	srv.ConfigureLogger()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv.Start()
	done := make(chan struct{})
	go func() {
		srv.WaitForShutdown()
		close(done)
	}()
	for {
		select {
		case <-ctx.Done():
			srv.Noticef("toolbus server: shutting down")
			srv.Shutdown()
			<-done
			return nil
		case <-done:
			return nil
		case <-hup:
			reloadConfigured(srv, f)
		}
	}
}

// reloadConfigured applies the configuration file again, with the same flags over it; a
// file that no longer parses, or changes what cannot change while running, is logged
// and the server goes on as it was.
//
// nats-server 2.15.2 reads its options unlocked where this swaps them (direct gets read
// s.opts.MaxPending; stream creation, account registration): a data race inside it that
// nats-server's own SIGHUP has too, harmless in practice here (one pointer, old or new
// options, both complete) but fatal to a race-instrumented test binary, so tests reload
// servers that clients use as processes (testutil.StartNATS). The JWT kind changes an
// account with no reload (toolbus admin -push).
func reloadConfigured(srv *server.Server, f Configured) {
	opts, err := ConfiguredOptions(f)
	if err == nil {
		err = srv.ReloadOptions(opts)
	}
	if err != nil {
		srv.Errorf("toolbus server: configuration not reloaded: %v", err)
		return
	}
	srv.Noticef("toolbus server: configuration %s reloaded", f.Config)
}
