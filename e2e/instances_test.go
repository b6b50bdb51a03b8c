package e2e_test

import (
	"context"
	"encoding/json"
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
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/planner"
)

// Instance records are a team's own. Team alpha runs two executors of its tool "held"
// (a call with a side effect that blocks until the test releases it); alpha-1 runs a
// call, and copies of that call (as a redelivery or a duplicate would bring them) reach
// alpha-2, which waits while alpha-1 is alive and would take the call over, and run it
// a second time, the moment alpha-1's instance record is gone. Team beta, with the
// executor credentials the generator issued it, keeps deleting, purging and
// overwriting alpha-1's record, and writes records under alpha's token and under the
// untokened layout: the server refuses every write (a permissions violation), alpha-1's
// record stays, the call runs exactly once and the run completes. A heartbeat beta may
// write (under its own token) naming alpha's tool does not make beta an instance of it
// for the planner's catalog. For each credential kind of deploy/nats/gen.
func TestSecurityTeamInstances(t *testing.T) {
	t.Parallel()
	perms := filepath.Join("..", "deploy", "nats", "permissions.conf")
	grants := natsjwt.Grants{Teams: map[string][]string{"alpha": {"held"}, "beta": {"noop"}}}
	for _, mode := range genModes() {
		t.Run(mode.name, func(t *testing.T) {
			res, err := natsjwt.GenerateGrants(perms, t.TempDir(), grants, natsjwt.WithBcryptCost(bcrypt.MinCost))
			if err != nil {
				t.Fatal(err)
			}
			srv := startConfigured(t, mode.conf(res), nil)
			opts := map[string][]nats.Option{}
			for _, u := range natsjwt.Users(nil, grants) {
				opts[u.Name] = []nats.Option{mode.opt(t, res, u.Name), nats.Timeout(30 * time.Second)}
			}
			side := &sideEffects{}
			started := make(chan string, 16)
			release := make(chan struct{})
			held := executor.Tool{Name: "held", Description: "a side effect that waits for the test", InputSchema: objectSchema,
				Timeout: 5 * time.Minute,
				Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
					ci, _ := executor.CallInfoFrom(ctx)
					side.add(ci.IdempotencyKey)
					started <- ci.IdempotencyKey
					select {
					case <-release:
						return "done once", nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}}
			model := &planner.Script{Steps: []func(planner.Request) planner.Response{
				planner.Calls(call("h", "held", `{}`)), planner.Answer("done"),
			}}
			alpha := natsjwt.TeamUser("alpha")
			// The point is that beta's writes cause no takeover, not how a lease fares on a
			// starved machine: with the default 10 s TTL, renewals held up for 8 s (a
			// loaded CI under -race) let alpha-1's own lease lapse, and alpha-2 then takes
			// the call over by design. A deleted record is gone at once whatever the TTL.
			s := newSecuredStackConfig(t, srv.ClientURL(), events.Config{InstanceTTL: time.Minute}, opts,
				[]string{"planner", "injector", "client", alpha}, model, held)
			startAlpha := func(instance string) {
				exec := must(executor.New(s.reg, executor.WithInstance(instance), executor.WithLogger(s.log)))
				// One call at a time: while alpha-1 runs the call, the copies go to alpha-2.
				w := must(worker.New(s.buses[alpha], exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: instance,
					Concurrency: 1, Grace: time.Second, Logger: s.log}, Tools: []string{"held"}, Team: "alpha"}))
				s.start(instance, w.Run)
			}
			cat, err := s.buses["planner"].Store().WatchCatalog(s.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			servedBy := func(want ...string) {
				t.Helper()
				eventstest.Eventually(t, 30*time.Second, func() error {
					if got := cat.Serving("held"); !slices.Equal(got, want) {
						return fmt.Errorf("held served by %v, want %v", got, want)
					}
					return nil
				})
			}
			startAlpha("alpha-1")
			servedBy("alpha-1")
			s.startPlanner("instances-planner")
			s.startInjector("instances-injector")

			run := "instances-" + mode.name
			ts := &teamsBus{s, newQueueParks()}
			if err := s.buses["client"].StartRun(s.ctx, events.Source("cli", "instances"), toolbus.RunStarted{RunID: run,
				Principal: toolbus.Principal{ID: "instances-tester"}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "go"}}}); err != nil {
				t.Fatal(err)
			}
			var key string
			select {
			case key = <-started:
			case <-time.After(60 * time.Second):
				t.Fatalf("the call did not start (violations %v)", s.viol.all())
			}
			startAlpha("alpha-2")
			servedBy("alpha-1", "alpha-2")

			// Copies of the call, as redeliveries would bring them, while alpha-1 runs it.
			admin := s.buses["admin"]
			evs, err := runlog.Read(s.ctx, admin.EventStream(), events.SubjectRun(run))
			if err != nil {
				t.Fatal(err)
			}
			var req runlog.StoredEvent
			for _, ev := range evs {
				if ev.Meta.Type == events.TypeToolRequested {
					req = ev
				}
			}
			js := must(jetstream.New(s.conns["admin"]))
			const copies = 3
			for i := range copies {
				m := encodeOrFail(t, req.Subject, req.Meta, req.Data)
				m.Header.Set(events.HeaderMsgID, fmt.Sprintf("%s/copy-%d", req.Meta.ID, i)) // stored again, not deduplicated
				if _, err := js.PublishMsg(s.ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			queue := must(admin.QueueStream().Consumer(s.ctx, events.ToolConsumer("held")))
			eventstest.Eventually(t, 30*time.Second, func() error {
				ci, err := queue.Info(s.ctx)
				if err != nil {
					return err
				}
				if ci.NumPending != 0 || ci.NumAckPending != copies+1 {
					return fmt.Errorf("copies not all delivered: %d pending, %d unacknowledged", ci.NumPending, ci.NumAckPending)
				}
				return nil
			})

			// Beta attacks alpha-1's record with its own credentials, on a fresh connection.
			var rec store.Instance
			ins, err := admin.Store().Instances(s.ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range ins {
				if in.Name == "alpha-1" {
					rec = in
				}
			}
			if rec.Team != "alpha" || rec.Boot == "" {
				t.Fatalf("alpha-1's record: %+v", rec)
			}
			alphaKey := store.InstanceKey("alpha", "alpha-1", rec.Boot)
			subject := "$KV." + store.BucketInstances + "."
			beta := natsjwt.TeamUser("beta")
			seen := &violations{}
			nc, err := connectAs(t, srv.ClientURL(), beta, seen, opts[beta]...)
			if err != nil {
				t.Fatal(err)
			}
			forged := `{"name":"alpha-1","boot":"` + rec.Boot + `","tools":[]}`
			attacks := []struct {
				name, key, body string
				hdr             []string
			}{
				{"overwrite alpha-1's record", alphaKey, forged, nil},
				{"write a record under alpha's token", store.InstanceKey("alpha", "beta-spy", "b"), `{"name":"beta-spy","tools":["held"]}`, nil},
				{"write an untokened record", store.InstanceKey("", "beta-spy", "b"), `{"name":"beta-spy","tools":["held"]}`, nil},
				// Last, so that, were they allowed, the record would be gone between rounds.
				{"purge alpha-1's record", alphaKey, "", []string{"KV-Operation", "PURGE", "Nats-Rollup", "sub"}},
				{"delete alpha-1's record", alphaKey, "", []string{"KV-Operation", "DEL"}},
			}
			// Long enough for alpha-2 to look at the claim's owner several times (every
			// second): had any delete gone through, it would have taken the call over.
			until := time.Now().Add(4 * time.Second)
			for time.Now().Before(until) {
				for _, a := range attacks {
					m := rawMsg(subject+a.key, []byte(a.body), a.hdr...)
					if err := publishAndFlush(s.ctx, nc, m.Subject, m.Data, m.Header); err != nil {
						t.Fatalf("%s: %v", a.name, err)
					}
				}
				if _, err := admin.Store().InstanceStoredAt(s.ctx, "alpha", "alpha-1", rec.Boot, 0); err != nil {
					t.Fatalf("alpha-1's record after beta's attacks: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			eventstest.Eventually(t, 15*time.Second, func() error {
				for _, a := range attacks {
					if !seen.has(beta, subject+a.key) {
						return fmt.Errorf("%s: no permissions violation on %s (got %v)", a.name, subject+a.key, seen.all())
					}
				}
				return nil
			})
			// A heartbeat under beta's own token naming alpha's tool is beta's to write,
			// and counts for nothing.
			betaBus := must(events.Open(s.ctx, nc, events.Config{}))
			if _, err := betaBus.Store().PutInstance(s.ctx, store.Instance{Team: "beta", Name: "beta-spy", Boot: "b", Tools: []string{"held", "noop"}}); err != nil {
				t.Fatalf("beta's own heartbeat: %v", err)
			}
			eventstest.Eventually(t, 10*time.Second, func() error {
				if !slices.ContainsFunc(cat.Instances(), func(in store.Instance) bool { return in.Name == "beta-spy" && in.Team == "beta" }) {
					return fmt.Errorf("the planner's catalog has not read beta's heartbeat yet: %+v", cat.Instances())
				}
				return nil
			})
			servedBy("alpha-1", "alpha-2")

			close(release)
			end := s.waitEnd(run)
			if end.Status != toolbus.RunCompleted {
				t.Fatalf("run ended %s (%s)", end.Status, end.Reason)
			}
			// Every copy was handled (acknowledged) without running the tool again.
			eventstest.Eventually(t, 30*time.Second, func() error {
				ci, err := queue.Info(s.ctx)
				if err != nil {
					return err
				}
				if ci.NumPending != 0 || ci.NumAckPending != 0 {
					return fmt.Errorf("%d pending, %d unacknowledged", ci.NumPending, ci.NumAckPending)
				}
				return nil
			})
			if got := side.counts(); len(got) != 1 || got[key] != 1 {
				t.Fatalf("side effects %v, want the call %s run once", got, key)
			}
			results, _ := ts.results(run)
			if r := results["h"]; len(r) != 1 || r[0].Status != toolbus.StatusSucceeded || r[0].Attempt != 1 {
				t.Fatalf("results of the call: %+v, want one, of attempt 1", r)
			}
			if v := s.viol.all(); len(v) > 0 {
				t.Fatalf("permission violations of the roles: %v", v)
			}
		})
	}
}
