// Command testbus runs the bus the TypeScript package's tests (npm test) talk to when
// no TOOLBUS_TEST_NATS_URL is given: an embedded NATS JetStream server on a random
// loopback port with toolbus's stream and buckets set up (provision.Setup). It prints
// the server's URL on one line of stdout and stops when stdin closes (the test process
// that started it ended) or on SIGINT/SIGTERM.
//
//	go run ./testbus   (from sdk/typescript)
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := provision.Setup(ctx, nc, events.Config{}); err != nil {
		return err
	}
	fmt.Println(srv.ClientURL())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(eof) }()
	select {
	case <-stop:
	case <-eof:
	}
	return nil
}
