package reads_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/reads"
)

// TestRunsListingCostsTheAskersRunsOnly: a client's listing of its runs costs the core
// the same JetStream requests however many runs others have, and reads nothing through
// the injector's run cache (the read service shares the injector's bus): others' runs
// neither cost a read each nor evict what the injector cached (issue 54). Control: the
// listing names the asker's runs (as principal and as approver) and none of another's,
// and the other's listing names its own.
func TestRunsListingCostsTheAskersRunsOnly(t *testing.T) {
	srv := intaketest.StartTenants(t, nil, map[string][]string{"alice": {"alice"}, "bob": {"bob"}})
	ctx := eventstest.Context(t, 2*time.Minute)
	core := eventstest.Connect(t, srv, "core")
	bus, _, err := provision.Setup(ctx, core, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = reads.New(bus, nil).Serve(ctx) }()
	js, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	start := func(run, principal string, approvers ...string) {
		t.Helper()
		env := events.RunStartedEvent("test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: principal}, Approvers: approvers})
		msg, err := events.Encode(env.Subject, env.Meta, env.Data)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.Store().CreateRunState(ctx, run, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	bobs := func(from, to int) {
		for i := from; i < to; i++ {
			start(fmt.Sprint("bob-", i), "bob")
		}
	}
	start("alice-own", "alice")
	start("bob-asks-alice", "bob", "alice")
	bobs(0, 10)

	spy := eventstest.Connect(t, srv, "core")
	list := func(who string) (runs []string, requests int) {
		t.Helper()
		sub, err := spy.SubscribeSync("$JS.API.>")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		var m *nats.Msg
		eventstest.Eventually(t, 30*time.Second, func() error { // the read service subscribes as it starts
			m, err = eventstest.Connect(t, srv, who).Request(events.ReadRunsSubject(who), nil, 30*time.Second)
			return err
		})
		var states []store.RunState
		if err := json.Unmarshal(m.Data, &states); err != nil {
			t.Fatalf("%s's listing: %v: %q %v", who, err, m.Data, m.Header)
		}
		for _, st := range states {
			runs = append(runs, st.RunID)
		}
		if err := spy.Flush(); err != nil { // the core's requests made for the listing reached spy before its answer
			t.Fatal(err)
		}
		n, _, err := sub.Pending()
		if err != nil {
			t.Fatal(err)
		}
		return runs, n
	}
	if runs, _ := list("alice"); !slices.Equal(runs, []string{"alice-own", "bob-asks-alice"}) {
		t.Fatalf("alice's listing: %v, want her run and the run naming her an approver", runs)
	}
	if runs, _ := list("bob"); len(runs) != 11 || slices.Contains(runs, "alice-own") {
		t.Fatalf("control: bob's listing: %v, want his 11 runs", runs)
	}
	// The injector reads a run's start through its cache, as it does for every event.
	if _, err := bus.RunStarted(ctx, "alice-own"); err != nil {
		t.Fatal(err)
	}
	_, before := list("alice")
	bobs(10, 60)
	runs, after := list("alice")
	if !slices.Equal(runs, []string{"alice-own", "bob-asks-alice"}) {
		t.Fatalf("alice's listing after bob's runs: %v", runs)
	}
	t.Logf("alice's listing: %d JetStream requests with bob's 11 runs, %d with 61", before, after)
	if after > before+5 {
		t.Errorf("HOLE: alice's listing cost %d JetStream requests with bob's 11 runs and %d with 61: it grows with others' runs", before, after)
	}

	// Nothing the listings did touched the injector's cache: its run still reads without a
	// request, and bob's runs were never read into it.
	cost := func(run string) int {
		t.Helper()
		sub, err := spy.SubscribeSync("$JS.API.>")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.RunStarted(ctx, run); err != nil {
			t.Fatal(err)
		}
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		n, _, _ := sub.Pending()
		return n
	}
	if n := cost("alice-own"); n != 0 {
		t.Errorf("HOLE: the injector's cached run cost %d requests after listings: they emptied its cache", n)
	}
	if n := cost("bob-59"); n == 0 {
		t.Errorf("HOLE: listings read bob's runs into the injector's cache (which is emptied whole when full)")
	}
}
