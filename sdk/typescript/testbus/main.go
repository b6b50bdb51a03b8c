// Command testbus runs the bus the TypeScript package's tests (npm test) talk to when
// no TOOLBUS_TEST_NATS_URL is given: an embedded NATS JetStream server on a random
// loopback port with toolbus's stream and buckets set up (provision.Setup), and the
// pipeline's roles on it: a planner (pre-planned runs only: a run that needs a model
// waits), an injector and a Go executor serving the demo and diag
// packs. It prints the server's URL on one line of stdout and stops when stdin closes
// (the test process that started it ended) or on SIGINT/SIGTERM.
//
//	go run ./testbus   (from sdk/typescript)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testbus:", err)
		os.Exit(1)
	}
}

func run() error {
	dir, err := os.MkdirTemp("", "toolbus-testbus-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		return err
	}
	defer srv.Stop()
	nc, err := srv.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	roles, err := Pipeline(ctx, nc, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	fmt.Println(srv.ClientURL())
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(eof) }()
	select {
	case <-ctx.Done():
	case <-eof:
	}
	stop()
	return roles()
}

// WaitingModel answers no run: this bus has no model, so a run that is not pre-planned
// stays running (its model call waits until the planner's model timeout) and the
// executor tests' runs, which a test drives call by call, are never ended by the pipeline.
var WaitingModel = planner.ModelFunc(func(ctx context.Context, _ planner.Request) (planner.Response, error) {
	<-ctx.Done()
	return planner.Response{}, ctx.Err()
})

// Pipeline sets the bus up on nc and runs a planner (pre-planned runs only), an
// injector and a Go executor of the demo and diag packs until ctx ends; wait waits for
// them to stop.
func Pipeline(ctx context.Context, nc *nats.Conn, log *slog.Logger) (wait func() error, err error) {
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	bus, _, err := provision.Setup(sctx, nc, events.Config{})
	if err != nil {
		return nil, err
	}
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo", "diag"); err != nil {
		return nil, err
	}
	exec, err := executor.New(reg, executor.WithLogger(log), executor.WithInstance("go-exec-1"))
	if err != nil {
		return nil, err
	}
	wc := func(instance string) events.WorkerConfig {
		return events.WorkerConfig{Instance: instance, Logger: log, Grace: time.Second}
	}
	w, err := worker.New(bus, exec, worker.Config{WorkerConfig: wc("go-exec-1")})
	if err != nil {
		return nil, err
	}
	cat, err := bus.Store().WatchCatalog(ctx, log)
	if err != nil {
		return nil, err
	}
	p, err := planner.New(bus, WaitingModel, cat, planner.Config{WorkerConfig: wc("planner-1")})
	if err != nil {
		return nil, err
	}
	inj, err := injector.New(bus, injector.Config{WorkerConfig: wc("injector-1")})
	if err != nil {
		return nil, err
	}
	errs := make(chan error, 3)
	for _, r := range []func(context.Context) error{w.Run, p.Run, inj.Run} {
		go func() { errs <- r(ctx) }()
	}
	// The Go tools are in the catalog before the URL is handed out.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, ok := cat.Lookup("calculator"); ok {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("the Go executor's tools never reached the catalog")
		}
	}
	return func() error {
		var all []error
		for range 3 {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	}, nil
}
