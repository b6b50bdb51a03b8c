package admin

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
)

// TestRevokedToolLeavesTheListingAtOnce: on a live deployment (the generated credentials,
// the server of auth-jwt.conf), team beta's executor credentials publish beta's tools
// and an instance record serving them. A tool revoked with -push, and one revoked
// without it and pushed later with `toolbus admin push`, are gone from the FIRST
// `toolbus tools` listing (callrun.ToolRows on admin.creds) and from the tools offered to
// models (the catalog the planner reads) once the command returns: the grants the
// servers took decide, not the executors' records, which still name both tools.
// CONTROL: alpha's tool and beta's tool still granted stay listed and offered, and a
// grant with -push puts the revoked tool back in the first listing after it.
func TestRevokedToolLeavesTheListingAtOnce(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	l := newLiveAdmin(t, ctx)
	l.adm("", "init")
	l.adm("", "add-team", "alpha", "calc")
	l.adm("", "add-team", "beta", "web", "search", "fetch")
	srv, _ := l.serve(provision.WithTools([]string{"calc", "web", "search", "fetch"}, 30*time.Second, 10))
	url := srv.ClientURL()
	core, err := events.Open(ctx, l.must("admin.creds"), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for team, tools := range map[string][]string{"alpha": {"calc"}, "beta": {"web", "search", "fetch"}} {
		bus, err := events.Open(ctx, l.must("executor-"+team+".creds"), events.Config{APIPrefix: accounts.CoreAPIPrefix})
		if err != nil {
			t.Fatal(err)
		}
		for _, tool := range tools {
			if err := bus.Store().PublishTool(ctx, toolbus.ToolContract{Name: tool, Description: tool, Owner: team}, false); err != nil {
				t.Fatalf("%s publishing %s: %v", team, tool, err)
			}
		}
		beat := func() error {
			now := time.Now().UTC()
			_, err := bus.Store().PutInstance(ctx, store.Instance{Team: team, Name: team + "-1", Boot: "b", Tools: tools,
				Concurrency: 1, StartedAt: now, HeartbeatAt: now})
			return err
		}
		if err := beat(); err != nil {
			t.Fatal(err)
		}
		// The records heartbeat as an executor's do: on a busy machine the admin commands
		// below take longer than the instance TTL (5 s), and a record gone stale would
		// empty the tools offered for a reason that is not the revocation.
		go heartbeat(ctx, beat)
	}
	listed := func() (rows, offered []string) {
		t.Helper()
		rs, err := callrun.ToolRows(ctx, core)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			rows = append(rows, r.Name)
		}
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		tcs, err := core.OfferedTools(cctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range tcs {
			offered = append(offered, tc.Name)
		}
		return rows, offered
	}
	check := func(when string, want ...string) {
		t.Helper()
		rows, offered := listed()
		slices.Sort(want)
		if !slices.Equal(rows, want) || !slices.Equal(offered, want) {
			t.Errorf("%s: toolbus tools lists %v, models are offered %v; want %v", when, rows, offered, want)
		}
	}
	check("before any revocation", "calc", "fetch", "search", "web")
	l.adm(url, "revoke", "beta", "web", "-push")
	check("the first listing after revoke beta web -push", "calc", "fetch", "search")
	l.adm("", "revoke", "beta", "search")
	l.adm(url, "push")
	check("the first listing after revoke beta search, then push", "calc", "fetch")
	l.adm(url, "grant", "beta", "web", "-push")
	check("the first listing after grant beta web -push", "calc", "fetch", "web")
}

// heartbeat calls beat every second until ctx ends, as an executor refreshes its
// instance record.
func heartbeat(ctx context.Context, beat func() error) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_ = beat()
		}
	}
}
