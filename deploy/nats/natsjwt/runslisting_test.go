package natsjwt_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
)

// TestRunsListingCostsTheAskersRunsOnly: in each kind of generated credentials of the
// accounts layout, with the core's read service on the generated injector's credentials
// (as every injector runs it), a bound client's listing of its runs is answered, and
// costs the core the same JetStream requests however many runs others have, reading
// nothing through the injector's run cache: others' runs neither cost a read each nor
// evict what the injector cached (issue 54). The stream is laid out as `toolbus init`
// makes it (a read mirror serving the direct gets), and for the jwt kind without the
// mirror (the stream serves them). Control: the listing names the asker's runs (as
// principal and as approver) and none of another's, and the other's listing names its
// own. An index that needs a consumer the injector may not create answers no listing.
func TestRunsListingCostsTheAskersRunsOnly(t *testing.T) {
	g := natsjwt.Grants{Clients: map[string][]string{"alice": {"alice"}, "bob": {"bob"}}}
	res, err := natsjwt.GenerateGrants(filepath.Join("..", "permissions.conf"), t.TempDir(), g, natsjwt.WithAccounts(), natsjwt.WithBcryptCost(bcrypt.MinCost))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := eventstest.Context(t, 2*time.Minute)
			d := startAccounts(t, ctx, kind, res)
			var setup []provision.Option
			if kind.name != "jwt" {
				setup = append(setup, provision.WithReadMirror())
			}
			admin, _, err := provision.Setup(ctx, d.conn("admin"), events.Config{}, setup...)
			if err != nil {
				t.Fatal(err)
			}
			inj, err := events.Open(ctx, d.conn("injector"), events.Config{})
			if err != nil {
				t.Fatal(err)
			}
			serveReads(t, ctx, d, inj)
			listingCost(t, ctx, d, admin, inj)
		})
	}
}

// listingCost starts runs of alice and bob with the administrator's bus and checks the
// listings of both and what alice's costs the core, whose injector's bus is inj.
func listingCost(t *testing.T, ctx context.Context, d *accountsDeployment, admin, inj *events.Bus) {
	start := func(run, principal string, approvers ...string) {
		t.Helper()
		if err := admin.StartRun(ctx, "test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: principal}, Approvers: approvers,
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "hi"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Store().CreateRunState(ctx, run, time.Time{}); err != nil {
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
	// spy hears the core's JetStream requests (direct gets included), in the core account.
	spy := d.conn("admin")
	counting := func(do func()) int {
		t.Helper()
		sub, err := spy.SubscribeSync("$JS.API.>")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		do()
		if err := spy.Flush(); err != nil { // what was sent for do reached spy before its answer
			t.Fatal(err)
		}
		n, _, _ := sub.Pending()
		return n
	}
	clients := map[string]*nats.Conn{"alice": d.client("alice", "alice"), "bob": d.client("bob", "bob")}
	list := func(who string) (runs []string, requests int) {
		t.Helper()
		requests = counting(func() {
			m, err := clients[who].RequestWithContext(ctx, events.ReadRunsSubject(who), nil)
			if err != nil {
				t.Fatalf("%s's listing: %v", who, err)
			}
			var states []store.RunState
			if err := json.Unmarshal(m.Data, &states); err != nil {
				t.Fatalf("%s's listing: %v: %q %v", who, err, m.Data, m.Header)
			}
			for _, st := range states {
				runs = append(runs, st.RunID)
			}
		})
		return runs, requests
	}
	if runs, _ := list("alice"); !slices.Equal(runs, []string{"alice-own", "bob-asks-alice"}) {
		t.Fatalf("alice's listing: %v, want her run and the run naming her an approver", runs)
	}
	if runs, _ := list("bob"); len(runs) != 11 || slices.Contains(runs, "alice-own") {
		t.Fatalf("control: bob's listing: %v, want his 11 runs", runs)
	}
	// The injector reads a run's start through its cache, as it does for every event.
	if _, err := inj.RunStarted(ctx, "alice-own"); err != nil {
		t.Fatal(err)
	}
	_, before := list("alice")
	bobs(10, 60)
	mirrored(t, d)
	runs, after := list("alice")
	if !slices.Equal(runs, []string{"alice-own", "bob-asks-alice"}) {
		t.Fatalf("alice's listing after bob's runs: %v", runs)
	}
	_, settled := list("alice")
	t.Logf("alice's listing: %d JetStream requests with bob's 11 runs, %d just after bob's 50 more, %d then", before, after, settled)
	if after > before+5 || settled > before {
		t.Errorf("HOLE: alice's listing cost %d JetStream requests with bob's 11 runs and %d, then %d, with 61: it grows with others' runs", before, after, settled)
	}
	// Nothing the listings did touched the injector's cache: its run still reads without a
	// request, and bob's runs were never read into it.
	cost := func(run string) int {
		t.Helper()
		return counting(func() {
			if _, err := inj.RunStarted(ctx, run); err != nil {
				t.Fatal(err)
			}
		})
	}
	if n := cost("alice-own"); n != 0 {
		t.Errorf("HOLE: the injector's cached run cost %d requests after listings: they emptied its cache", n)
	}
	if n := cost("bob-59"); n == 0 {
		t.Errorf("HOLE: listings read bob's runs into the injector's cache (which is emptied whole when full)")
	}
}

// mirrored waits until the read mirror, where there is one, holds what the stream does:
// a listing reads the stream itself only for what the mirror does not hold yet.
func mirrored(t *testing.T, d *accountsDeployment) {
	t.Helper()
	eventstest.Eventually(t, 30*time.Second, func() error {
		m, err := d.core.Stream(d.ctx, events.ReadMirrorName("TOOLBUS"))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		s, err := d.core.Stream(d.ctx, "TOOLBUS")
		if err != nil {
			return err
		}
		if got, want := m.CachedInfo().State.LastSeq, s.CachedInfo().State.LastSeq; got != want {
			return fmt.Errorf("the read mirror holds up to %d of %d", got, want)
		}
		return nil
	})
}
