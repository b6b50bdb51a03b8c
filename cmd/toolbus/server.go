package main

import (
	"context"
	"fmt"
	"io"

	"github.com/toolbus/toolbus/embedded"
)

// cmdServer runs a NATS server from a configuration file with the server library this
// binary links, so a deployment needs no separate nats-server: the files of
// deploy/nats/ or those go run ./deploy/nats/gen writes. -sd, -a, -p and -m override
// the file (a store_dir in it included). SIGINT and SIGTERM shut it down cleanly (JetStream
// flushed), SIGHUP reloads the file (users, permissions, accounts) keeping every
// connection. A file that does not parse, or a JetStream server with no store
// directory, is refused before anything starts.
func cmdServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("server", "server -c FILE [-sd DIR] [-a HOST] [-p PORT] [-m PORT] [-t]", stderr)
	var f embedded.Configured
	fs.StringVar(&f.Config, "c", "", "the NATS server configuration file (required): one of deploy/nats/, or one go run ./deploy/nats/gen wrote")
	fs.StringVar(&f.StoreDir, "sd", "", "JetStream store directory (overrides the file's store_dir)")
	fs.StringVar(&f.Host, "a", "", "host (address) to listen on for clients (overrides the file's listen)")
	fs.IntVar(&f.Port, "p", 0, "port to listen on for clients (overrides the file's listen)")
	fs.StringVar(&f.Monitor, "m", "", "monitoring port, /healthz, /varz, /jsz (overrides the file's http port; 0: no monitoring)")
	check := fs.Bool("t", false, "check the configuration and exit")
	verbose := fs.Lookup("v")
	verbose.Usage = "verbose: the server's debug log (as nats-server -D)"
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	f.Debug = verbose.Value.String() == "true"
	if fs.NArg() != 0 {
		return usageError(fs, fmt.Sprintf("server: unexpected argument %q", fs.Arg(0)))
	}
	if f.Config == "" {
		return usageError(fs, "server: -c FILE is required (a NATS server configuration)")
	}
	opts, err := embedded.ConfiguredOptions(f)
	if err != nil {
		return &exitError{code: 1, msg: err.Error()}
	}
	if *check {
		fmt.Fprintf(stdout, "server: configuration %s is valid\n", f.Config)
		return nil
	}
	if err := embedded.ServeConfigured(ctx, opts, f); err != nil {
		return &exitError{code: 1, msg: err.Error()}
	}
	return nil
}
