package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

// serverFlags are the settings of `toolbus server`: the configuration file and what
// overrides it.
type serverFlags struct {
	config, storeDir, host string
	port                   int
	// monitor is the monitoring port: "" as the file says, "0" none.
	monitor string
	debug   bool
}

// cmdServer runs a NATS server from a configuration file with the server library this
// binary links, so a deployment needs no separate nats-server: the files of
// deploy/nats/ or those go run ./deploy/nats/gen writes. -sd, -a, -p and -m override
// the file (a store_dir in it included). SIGINT and SIGTERM shut it down cleanly (JetStream
// flushed), SIGHUP reloads the file (users, permissions, accounts) keeping every
// connection. A file that does not parse, or a JetStream server with no store
// directory, is refused before anything starts.
func cmdServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("server", "server -c FILE [-sd DIR] [-a HOST] [-p PORT] [-m PORT] [-t]", stderr)
	var f serverFlags
	fs.StringVar(&f.config, "c", "", "the NATS server configuration file (required): one of deploy/nats/, or one go run ./deploy/nats/gen wrote")
	fs.StringVar(&f.storeDir, "sd", "", "JetStream store directory (overrides the file's store_dir)")
	fs.StringVar(&f.host, "a", "", "host (address) to listen on for clients (overrides the file's listen)")
	fs.IntVar(&f.port, "p", 0, "port to listen on for clients (overrides the file's listen)")
	fs.StringVar(&f.monitor, "m", "", "monitoring port, /healthz, /varz, /jsz (overrides the file's http port; 0: no monitoring)")
	check := fs.Bool("t", false, "check the configuration and exit")
	verbose := fs.Lookup("v")
	verbose.Usage = "verbose: the server's debug log (as nats-server -D)"
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	f.debug = verbose.Value.String() == "true"
	if fs.NArg() != 0 {
		return usageError(fs, fmt.Sprintf("server: unexpected argument %q", fs.Arg(0)))
	}
	if f.config == "" {
		return usageError(fs, "server: -c FILE is required (a NATS server configuration)")
	}
	opts, err := serverOptions(f)
	if err != nil {
		return &exitError{code: 1, msg: err.Error()}
	}
	if *check {
		fmt.Fprintf(stdout, "server: configuration %s is valid\n", f.config)
		return nil
	}
	return serve(ctx, opts, f)
}

// serverOptions reads the configuration file and applies the flags over it.
func serverOptions(f serverFlags) (*server.Options, error) {
	opts, err := server.ProcessConfigFile(f.config)
	if err != nil {
		return nil, fmt.Errorf("server: configuration %s: %s", f.config, strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; "))
	}
	if f.storeDir != "" {
		opts.StoreDir = f.storeDir
	}
	if f.host != "" {
		opts.Host = f.host
	}
	if f.port != 0 {
		opts.Port = f.port
	}
	if f.monitor != "" {
		port, err := strconv.Atoi(f.monitor)
		if err != nil || port < 0 || port > 65535 {
			return nil, fmt.Errorf("server: -m %q: want a port number", f.monitor)
		}
		opts.HTTPPort = port
	}
	if f.debug {
		opts.Debug = true
	}
	// Timestamped log lines, as nats-server's -T (on by default there).
	opts.Logtime = true
	// This command handles the signals (serve): the library's handler exits the process.
	opts.NoSigs = true
	if opts.JetStream && opts.StoreDir == "" {
		// The library would store in a temporary directory, lost on a reboot.
		return nil, fmt.Errorf("server: configuration %s enables JetStream with no store_dir: give the directory with -sd DIR", f.config)
	}
	return opts, nil
}

// serve runs the server until ctx ends (SIGINT, SIGTERM) or it shuts down, reloading
// the configuration on SIGHUP.
func serve(ctx context.Context, opts *server.Options, f serverFlags) error {
	srv, err := server.NewServer(opts)
	if err != nil {
		return &exitError{code: 1, msg: fmt.Sprintf("server: configuration %s: %v", f.config, err)}
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
			reloadServer(srv, f)
		}
	}
}

// reloadServer applies the configuration file again, with the same flags over it; a
// file that no longer parses, or changes what cannot change while running, is logged
// and the server goes on as it was.
func reloadServer(srv *server.Server, f serverFlags) {
	opts, err := serverOptions(f)
	if err == nil {
		err = srv.ReloadOptions(opts)
	}
	if err != nil {
		srv.Errorf("toolbus server: configuration not reloaded: %v", err)
		return
	}
	srv.Noticef("toolbus server: configuration %s reloaded", f.config)
}
