package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
)

// The console's own tests are in package console; this one checks the wiring.

// TestUpServesConsole: toolbus up serves the console when TOOLBUS_CONSOLE_ADDR is set
// (public and read-only only when asked for), and stops it with the workers.
func TestUpServesConsole(t *testing.T) {
	noServerEnv(t)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	nln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	natsAddr := nln.Addr().String()
	nln.Close()
	t.Setenv("TOOLBUS_LISTEN", natsAddr)
	t.Setenv("TOOLBUS_CONSOLE_ADDR", addr)
	t.Setenv("TOOLBUS_CONSOLE_PUBLIC_READ", "true")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"up"}, &out, &errOut) }()
	eventstest.Eventually(t, 60*time.Second, func() error {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "<h1>Runs</h1>") || !strings.Contains(string(b), "read-only") {
			return fmt.Errorf("GET /: %d\n%s", resp.StatusCode, b)
		}
		return nil
	})
	// Stop up once its executor serves (an interrupt during start-up is another story).
	eventstest.Eventually(t, 60*time.Second, func() error {
		nc, err := nats.Connect("nats://" + natsAddr)
		if err != nil {
			return err
		}
		defer nc.Close()
		bus, err := events.Open(ctx, nc, events.Config{})
		if err != nil {
			return err
		}
		cat, err := bus.Store().WatchCatalog(ctx, nil)
		if err != nil {
			return err
		}
		if len(cat.Tools(nil)) == 0 {
			return errors.New("no tool served yet")
		}
		return nil
	})
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("toolbus up exited %d:\n%s", code, errOut.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("toolbus up did not stop")
	}
}
