package provision_test

import (
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
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
