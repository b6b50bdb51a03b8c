package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
)

// toolbus init creates everything once, then finds it unchanged; workers can then bind.
func TestInitIdempotent(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	t.Setenv("TOOLBUS_NATS_URL", srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"init", "--tools", "calculator,lookup_incident"}, &out, &errOut); code != 0 {
		t.Fatalf("init: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"created stream TOOLBUS", "created stream TOOLBUS_READ", "created bucket toolbus_runs",
		"created bucket toolbus_outputs", "created consumer planner", "created consumer injector-cancel",
		"created consumer tool_calculator"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("first init output lacks %q:\n%s", want, out.String())
		}
	}
	// Nobody consumes the calls of unknown tools (the planner answers them): no queue.
	if strings.Contains(out.String(), "tool__unknown") {
		t.Fatalf("init created the unknown-tool queue:\n%s", out.String())
	}
	out.Reset()
	if code := run(ctx, []string{"init", "--tools", "calculator,lookup_incident"}, &out, &errOut); code != 0 {
		t.Fatalf("second init: exit %d\n%s", code, errOut.String())
	}
	if strings.Contains(out.String(), "created") || strings.Contains(out.String(), "updated") {
		t.Fatalf("second init changed something:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "unchanged consumer tool_calculator") {
		t.Fatalf("second init output:\n%s", out.String())
	}
	// The stream denies deletes and purges; the outputs bucket is bounded.
	bus, err := events.Open(ctx, srv.Conn, events.Config{})
	if err != nil {
		t.Fatalf("open after init: %v", err)
	}
	c := bus.EventStream().CachedInfo().Config
	if !c.DenyDelete || !c.DenyPurge {
		t.Fatalf("stream config %+v: want deny delete and purge", c)
	}
	if bus.Reader().CachedInfo().Config.Name != "TOOLBUS_READ" {
		t.Fatal("the bus does not read from the mirror")
	}
	obj, err := srv.JS.Stream(ctx, "KV_"+store.BucketOutputs)
	if err != nil {
		t.Fatal(err)
	}
	if mb := obj.CachedInfo().Config.MaxBytes; mb != 1<<30 {
		t.Fatalf("outputs bucket max bytes %d, want 1 GiB", mb)
	}
	// Bad usage exits 2.
	if code := run(ctx, []string{"init", "--tools", "no spaces allowed"}, &out, &errOut); code != 2 {
		t.Fatalf("init with a bad tool name: exit %d", code)
	}
}

// Open on a server nobody set up names toolbus init.
func TestOpenWithoutInit(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	_, err := events.Open(context.Background(), srv.Conn, events.Config{})
	if err == nil || !strings.Contains(err.Error(), "toolbus init") {
		t.Fatalf("open before init: %v", err)
	}
}
