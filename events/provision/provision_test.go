package provision_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
)

// Setup creates the stream, its read mirror, every bucket and the durable consumers of
// the planner, the injector and each tool queue; run again, it changes nothing.
func TestSetupIsIdempotent(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, time.Minute)
	opts := []provision.Option{provision.WithTools([]string{"echo"}, 30*time.Second, 100), provision.WithReadMirror()}
	bus, first, err := provision.Setup(ctx, srv.Conn, events.Config{}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if !bus.Admin() {
		t.Error("the bus of Setup is not an administrator's")
	}
	made := map[string]bool{}
	for _, c := range first {
		if c.Action != "created" {
			t.Errorf("first Setup: %s", c)
		}
		made[c.Kind+" "+c.Name] = true
	}
	for _, want := range []string{"stream TOOLBUS", "stream " + events.ReadMirrorName("TOOLBUS"), "bucket toolbus_history",
		"consumer " + events.ConsumerPlanner, "consumer " + events.ConsumerInjectorTimers, "consumer " + events.ToolConsumer("echo")} {
		if !made[want] {
			t.Errorf("first Setup did not create %s (made %v)", want, first)
		}
	}
	_, second, err := provision.Setup(ctx, srv.Conn, events.Config{}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != len(first) {
		t.Fatalf("second Setup: %d changes, first %d", len(second), len(first))
	}
	for _, c := range second {
		if c.Action != "unchanged" {
			t.Errorf("second Setup: %s", c)
		}
	}
}

// A bus Setup returned updates a worker's consumer to the worker's settings; an opened
// bus is no administrator's.
func TestConsumerUpdatesOnAnAdminBus(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, time.Minute)
	bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wc := provision.WorkerConsumers(provision.RolePlanner, provision.WorkerSettings{AckWait: 45 * time.Second})[0]
	cons, err := provision.Consumer(ctx, bus, wc.ConsumerConfig)
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.AckWait; got != 45*time.Second {
		t.Fatalf("the planner's consumer has AckWait %v, want 45s", got)
	}
	opened, err := events.Open(ctx, srv.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if opened.Admin() {
		t.Error("an opened bus is an administrator's")
	}
}

// Whatever reads the event stream reads what was stored before it asked: a message
// is read back by its sequence as soon as its publish is acknowledged, and a run's
// events up to it are all there. A mirror of a stream that allows direct gets answers
// that stream's direct gets too (the server makes it inherit them), from wherever its
// copy has got to: with the read mirror of `toolbus init`, part of the reads of the
// event stream went to a copy that could be behind. The cases: a new deployment, one
// set up before the stream turned its direct gets off (the mirror inherited them),
// and such a one set up again without asking for the mirror (`toolbus up` on a server
// `toolbus init` prepared).
func TestEventStreamReadsItsOwnWrites(t *testing.T) {
	mirror := provision.WithReadMirror()
	for _, tc := range []struct {
		name  string
		older bool // the stream and mirror as a version with direct gets on both made them
		opts  []provision.Option
	}{
		{"init", false, []provision.Option{mirror}},
		{"init over an older init", true, []provision.Option{mirror}},
		{"setup over an older init", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := eventstest.RunJetStream(t)
			ctx := eventstest.Context(t, time.Minute)
			if tc.older {
				bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{})
				if err != nil {
					t.Fatal(err)
				}
				if !bus.EventStream().CachedInfo().Config.AllowDirect {
					t.Fatal("an unmirrored event stream does not allow direct gets")
				}
				m, err := bus.JetStream().CreateStream(ctx, jetstream.StreamConfig{Name: events.ReadMirrorName("TOOLBUS"),
					Mirror: &jetstream.StreamSource{Name: "TOOLBUS"}, AllowDirect: true})
				if err != nil {
					t.Fatal(err)
				}
				if !m.CachedInfo().Config.MirrorDirect {
					t.Fatal("the server did not make the mirror answer its origin's direct gets: the case tests nothing")
				}
			}
			bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{}, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := bus.JetStream().Stream(ctx, events.ReadMirrorName("TOOLBUS"))
			if err != nil {
				t.Fatal(err)
			}
			if m.CachedInfo().Config.MirrorDirect {
				t.Error("the read mirror answers the event stream's direct gets")
			}
			// Bursts of publishes, each message read back once its burst is
			// acknowledged: a copy behind by a burst misses a read more often than not.
			stream := bus.EventStream()
			missed := 0
			const n, burst = 400, 20
			for i := 0; i < n; i += burst {
				acks := make([]jetstream.PubAckFuture, burst)
				for j := range acks {
					if acks[j], err = bus.JetStream().PublishAsync(events.SubjectRunStarted(fmt.Sprintf("r%d", i+j), "p"), []byte("{}")); err != nil {
						t.Fatal(err)
					}
				}
				for j, f := range acks {
					var ack *jetstream.PubAck
					select {
					case ack = <-f.Ok():
					case err := <-f.Err():
						t.Fatal(err)
					}
					if _, err := stream.GetMsg(ctx, ack.Sequence); err != nil {
						missed++
						continue
					}
					if evs, err := runlog.Events(ctx, bus, fmt.Sprintf("r%d", i+j)); err != nil || len(evs) != 1 {
						missed++
					}
				}
			}
			if missed > 0 {
				t.Fatalf("%d of %d messages not read back right after their publish was acknowledged", missed, n)
			}
		})
	}
}

// A bus opened before `toolbus init` gave the event stream its read mirror (the stream
// then stops serving direct gets, which its cached stream info still promises) keeps
// reading: the first and last event of a run, and a run's events followed, each on a
// bus of its own.
func TestBusOpenedBeforeTheMirrorKeepsReading(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, time.Minute)
	if _, _, err := provision.Setup(ctx, srv.Conn, events.Config{}); err != nil {
		t.Fatal(err)
	}
	reads := map[string]func(b *events.Bus) error{
		"first event": func(b *events.Bus) error {
			_, err := runlog.First(ctx, b, events.SubjectRun("r"))
			return err
		},
		"last event": func(b *events.Bus) error {
			_, err := runlog.Last(ctx, b, events.SubjectRunStarted("r", "p"))
			return err
		},
		"followed": func(b *events.Bus) error {
			w, err := runlog.Watch(ctx, b, events.SubjectRun("r"), true)
			if err != nil {
				return err
			}
			if _, ok, err := w.Next(ctx, 10*time.Second); !ok {
				return fmt.Errorf("nothing came (%v)", err)
			}
			return nil
		},
	}
	workers := map[string]*events.Bus{}
	for name := range reads {
		b, err := events.Open(ctx, srv.Conn, events.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if !b.EventStream().CachedInfo().Config.AllowDirect {
			t.Fatal("the stream serves no direct gets before the mirror: the test tests nothing")
		}
		workers[name] = b
	}
	admin, _, err := provision.Setup(ctx, srv.Conn, events.Config{}, provision.WithReadMirror())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.JetStream().Publish(ctx, events.SubjectRunStarted("r", "p"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	for name, read := range reads {
		if err := read(workers[name]); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestSetupBoundsTheEventStream: TOOLBUS_STREAM_MAX_BYTES set, `toolbus init` (Setup)
// gives the existing event stream that max_bytes with discard new (a full stream refuses
// new messages, never drops the audit); unset again, the stream is unbounded again.
func TestSetupBoundsTheEventStream(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, time.Minute)
	for _, c := range []struct {
		bound, wantMax int64
		discard        jetstream.DiscardPolicy
	}{{0, -1, jetstream.DiscardOld}, {1 << 20, 1 << 20, jetstream.DiscardNew}, {0, -1, jetstream.DiscardOld}} {
		bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{StreamMaxBytes: c.bound})
		if err != nil {
			t.Fatal(err)
		}
		info, err := bus.EventStream().Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.MaxBytes != c.wantMax || info.Config.Discard != c.discard {
			t.Errorf("StreamMaxBytes %d: the stream has max_bytes %d, discard %v; want %d, %v", c.bound, info.Config.MaxBytes, info.Config.Discard, c.wantMax, c.discard)
		}
	}
}
