package intake_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// BenchmarkTeamWrite measures what the write service costs a team's write: a result of
// 1 KiB published and acknowledged by a team in its own account (through the core's
// intake) against the same publish from the core account (straight to the stream).
// Reported per write: latency with one in flight, and with 64 in flight (async).
func BenchmarkTeamWrite(b *testing.B) {
	srv := intaketest.StartTenants(b, map[string][]string{"alpha": {"calc"}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, _, err := provision.Setup(ctx, eventstest.Connect(b, srv, "core"), events.Config{}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 1024)
	for _, tc := range []struct{ name, user string }{{"core-direct", "core"}, {"team-through-intake", "alpha"}} {
		js, err := jetstream.New(eventstest.Connect(b, srv, tc.user))
		if err != nil {
			b.Fatal(err)
		}
		subject := events.SubjectToolFinished("bench", "calc")
		b.Run(tc.name+"/sync", func(b *testing.B) {
			for b.Loop() {
				if _, err := js.Publish(ctx, subject, data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/async-64", func(b *testing.B) {
			pending := make(chan jetstream.PubAckFuture, 64)
			done := make(chan error, 1)
			go func() {
				for f := range pending {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						done <- err
						return
					}
				}
				done <- nil
			}()
			for b.Loop() {
				f, err := js.PublishAsync(subject, data)
				if err != nil {
					b.Fatal(err)
				}
				pending <- f
			}
			close(pending)
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
