// Package eventstest starts a real embedded JetStream server for tests: no mock of the bus.
package eventstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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

// StartServer starts a nats-server with opts (a deployment's configuration: accounts,
// users, permissions) on a random port of 127.0.0.1, its store in a temp dir, and stops
// it when the test ends.
func StartServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPHost, opts.HTTPPort = "", 0
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatal("eventstest: server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// Counter subscribes nc to subject and returns how many messages the subscription has
// received so far. Each call first makes a round trip on nc: a request another
// connection sent and the server answered before the call was routed to the
// subscription before that answer, so it is counted (how the tests count reads).
func Counter(t testing.TB, nc *nats.Conn, subject string) func() int {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() int {
		t.Helper()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n, _, err := sub.Pending()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
}
