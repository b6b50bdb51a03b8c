package natsjwt_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/fair"
)

// TestInjectorAnswersOnlyWhoAsked: in the one-account layout the injector answers the
// requests it receives (the fair scheduler's view of what it holds) on the asker's reply
// subject, once, by allow_responses, and may publish on no other inbox. In each kind of
// generated credentials, with the core's scheduler running on the injector's
// credentials and holding calls of alice: alice's request of her view is answered with
// her held calls (the control: the answer path works), while the injector's publishes
// on alice's inbox subjects that no request of hers named, and a second answer to her
// request, reach nothing, each refused by the server as a permissions violation. With
// "_INBOX.>" in the injector's publish allow list (before), alice received them.
func TestInjectorAnswersOnlyWhoAsked(t *testing.T) {
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}}, Clients: map[string][]string{"alice": {"alice"}}}
	res, err := natsjwt.GenerateGrants(filepath.Join("..", "permissions.conf"), t.TempDir(), g, natsjwt.WithBcryptCost(bcrypt.MinCost))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := eventstest.Context(t, time.Minute)
			d := startAccounts(t, ctx, kind, res, "calc")
			admin, _, err := provision.Setup(ctx, d.conn("admin"), events.Config{FairShare: true}, provision.WithTools([]string{"calc"}, 0, 0))
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var denied []string
			inj, err := nats.Connect(d.srv.ClientURL(), kind.auth(t, res, "injector"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				denied = append(denied, err.Error())
				mu.Unlock()
			}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(inj.Close)
			bus, err := events.Open(ctx, inj, events.Config{FairShare: true})
			if err != nil {
				t.Fatal(err)
			}
			runScheduler(t, ctx, bus)
			for i := range 3 {
				tr := toolbus.ToolRequested{RunID: "held-alice", CallIndex: i, CallCount: 3, Principal: toolbus.Principal{ID: "alice"},
					Call: toolbus.ToolCall{CallID: fmt.Sprintf("c%d", i), Tool: "calc", Arguments: "{}"}}
				if _, err := admin.PublishEvent(ctx, events.ToolRequestedEvent("test", tr, true)); err != nil {
					t.Fatal(err)
				}
			}
			alice := d.conn(natsjwt.ClientUser("alice"))
			eventstest.Eventually(t, 30*time.Second, func() error {
				got := askWithin(t, alice, events.FairHeldForSubject("calc", "alice"), "", 5*time.Second)
				var hs []fair.Held
				if len(got) != 1 || json.Unmarshal(got[0].Data, &hs) != nil || len(hs) != 1 || hs[0].Tenant != "alice" || hs[0].Queued+hs[0].InFlight != 3 {
					return fmt.Errorf("control: alice's view of her held calls, answered by the injector's scheduler: %s", show(got))
				}
				return nil
			})
			// Alice's inboxes: one a request of hers names (answered once by the
			// injector, then a second time), and two no request named.
			reply, other := alice.NewRespInbox(), nats.NewInbox()
			subs := map[string]*nats.Subscription{}
			for _, s := range []string{reply, "_INBOX.alice.not-asked", other} {
				if subs[s], err = alice.SubscribeSync(s); err != nil {
					t.Fatal(err)
				}
			}
			if err := alice.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := alice.PublishRequest(events.FairHeldForSubject("calc", "alice"), reply, nil); err != nil {
				t.Fatal(err)
			}
			if m, err := subs[reply].NextMsg(5 * time.Second); err != nil || !strings.Contains(string(m.Data), `"tenant":"alice"`) {
				t.Fatalf("control: the scheduler's answer on alice's reply %s: %v %v", reply, m, err)
			}
			for s := range subs {
				if err := inj.Publish(s, []byte(`{"forged":"by the injector"}`)); err != nil {
					t.Fatal(err)
				}
			}
			if err := inj.Flush(); err != nil {
				t.Fatal(err)
			}
			for s, sub := range subs {
				if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
					t.Errorf("HOLE: the injector's publish on %s reached alice: %q", s, m.Data)
				}
			}
			eventstest.Eventually(t, 10*time.Second, func() error {
				mu.Lock()
				defer mu.Unlock()
				if n := strings.Count(strings.ToLower(strings.Join(denied, "; ")), "permissions violation for publish to \"_inbox."); n < 3 {
					return fmt.Errorf("the server refused %d of the injector's 3 publishes on inboxes: %v", n, denied)
				}
				return nil
			})
		})
	}
}
