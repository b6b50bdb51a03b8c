// Package eventstest starts a real embedded JetStream server for tests: no mock of the bus.
package eventstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
)

// Bus is a running test server with one client connection.
type Bus struct {
	Server *embedded.Server
	Conn   *nats.Conn
	JS     jetstream.JetStream
	// URL is the server's client URL, for processes or connections over TCP.
	URL string
}

// RunJetStream starts an embedded JetStream server on a random port with its store in a
// temp dir, connects to it in-process and stops both when the test ends.
func RunJetStream(t testing.TB) *Bus {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	nc, err := srv.Connect()
	if err != nil {
		srv.Stop()
		t.Fatalf("eventstest: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	t.Cleanup(func() {
		nc.Close()
		srv.Stop()
	})
	return &Bus{Server: srv, Conn: nc, JS: js, URL: srv.ClientURL()}
}

// Setup is RunJetStream with toolbus's stream and buckets set up by cfg (provision.Setup):
// the bus a worker or store test uses.
func Setup(t testing.TB, cfg events.Config) *events.Bus {
	t.Helper()
	bus, _, err := provision.Setup(Context(t, time.Minute), RunJetStream(t).Conn, cfg)
	if err != nil {
		t.Fatalf("eventstest: setup: %v", err)
	}
	return bus
}

// Connect opens another in-process connection, closed when the test ends.
func (b *Bus) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := b.Server.Connect()
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, js
}

// Context returns a context cancelled when the test ends or after d.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls f every 10ms until it returns nil or total elapses, then fails with
// f's last error. It replaces sleeps in tests.
func Eventually(t testing.TB, total time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("eventstest: condition not met after %v: %v", total, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
