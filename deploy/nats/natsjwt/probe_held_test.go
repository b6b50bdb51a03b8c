package natsjwt_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/fair"
)

// heldViewProbes: a bound client's import of what the fair scheduler holds of its own
// identity (toolbus_fair.held.<tool>.<identity>, accounts.ClientExports), with the
// core's scheduler running and holding calls of alice and of bob on tool (its cap
// reached). Alice's credentials ask bob's view, every tenant's, and wildcard and longer
// shapes of both, and her own with a body and header naming bob: no answer carries bob
// (his run ids, his name). She publishes onto bob's view and onto her own (no reply):
// the core hears her own (the control: the import is live) and nothing on bob's. She
// asks her own view with a reply subject that is a core stream's subject, and floods
// her account's reply subjects with a forged answer while bob asks his: nothing is
// stored in the core, and bob's answer is the scheduler's. A team's credentials reach
// no identity's view. Controls: the core sees both tenants, and bob's and alice's
// credentials each get their own held calls through their import.
func heldViewProbes(t *testing.T, ctx context.Context, d *accountsDeployment, bus *events.Bus, tool string, alpha, alice, bob *nats.Conn) {
	t.Helper()
	for _, who := range []string{"alice", "bob"} {
		mark := ownMark
		if who == "bob" {
			mark = secretMark
		}
		for i := range 3 {
			tr := toolbus.ToolRequested{RunID: "held-" + who, CallIndex: i, CallCount: 3, Principal: toolbus.Principal{ID: who},
				Call: toolbus.ToolCall{CallID: fmt.Sprintf("c%d", i), Tool: tool, Arguments: `{"q":"` + mark + `"}`}}
			if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("test", tr, true)); err != nil {
				t.Fatal(err)
			}
		}
	}
	held := func(ms []*nats.Msg) (tenants string, n int) {
		if len(ms) == 0 {
			return "", 0
		}
		var hs []fair.Held
		if err := json.Unmarshal(ms[0].Data, &hs); err != nil {
			return "unreadable: " + string(ms[0].Data), 0
		}
		var names []string
		for _, h := range hs {
			names = append(names, h.Tenant)
			n += h.Queued + h.InFlight
		}
		return strings.Join(names, ","), n
	}
	core := d.conn("admin")
	eventstest.Eventually(t, 30*time.Second, func() error {
		if got, n := held(askWithin(t, core, events.FairHeldSubject(tool), "", 5*time.Second)); got != "alice,bob" || n != 6 {
			return fmt.Errorf("control: the core's view of %s: %q, %d calls; want alice's and bob's 6", tool, got, n)
		}
		return nil
	})
	for who, nc := range map[string]*nats.Conn{"alice": alice, "bob": bob} {
		got := askWithin(t, nc, events.FairHeldForSubject(tool, who), "", 5*time.Second)
		if tenants, n := held(got); tenants != who || n != 3 {
			t.Errorf("control: %s's own view through its import: %q, %d calls (%s); want its 3 only", who, tenants, n, show(got))
		}
	}
	leaks := func(ms []*nats.Msg) bool {
		return carries(ms, "bob") || carries(ms, "held-bob") || carries(ms, secretMark)
	}
	forged := nats.Header{"Toolbus-Identity": {"bob"}, "Nats-Request-Info": {`{"acc":"bob"}`}}
	for _, p := range []struct{ who, subject, body string }{
		{"alice", events.FairHeldForSubject(tool, "bob"), ""},
		{"alice", events.FairHeldSubject(tool), ""},
		{"alice", events.FairHeldSubject(tool) + ".*", ""},
		{"alice", events.FairHeldSubject(tool) + ".>", ""},
		{"alice", events.FairHeldPrefix + ".*.bob", ""},
		{"alice", events.FairHeldPrefix + ".>", ""},
		{"alice", events.FairHeldForSubject(tool, "bob") + ".alice", ""},
		{"alice", events.FairHeldForSubject(tool, "alice") + ".bob", ""},
		{"alice", events.FairHeldForSubject(tool, "alice"), `{"tenant":"bob","identity":"bob"}`},
		{"alpha", events.FairHeldForSubject(tool, "alice"), ""},
		{"alpha", events.FairHeldForSubject(tool, "bob"), ""},
	} {
		nc := alice
		if p.who == "alpha" {
			nc = alpha
		}
		m := &nats.Msg{Subject: p.subject, Reply: nc.NewRespInbox(), Header: forged, Data: []byte(p.body)}
		sub, err := nc.SubscribeSync(m.Reply)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		a, err := sub.NextMsg(time.Second)
		_ = sub.Unsubscribe()
		switch {
		case err != nil: // no responders, or nothing: refused
		case p.who == "alpha" || leaks([]*nats.Msg{a}) || p.subject != events.FairHeldForSubject(tool, "alice"):
			t.Errorf("HOLE: %s's ask on %s was answered: %q", p.who, p.subject, a.Data)
		}
	}
	// Publishing into a view: what reaches the core account on the scheduler's subjects.
	heard, err := core.SubscribeSync(events.FairHeldPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := core.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{events.FairHeldForSubject(tool, "bob"), events.FairHeldSubject(tool), events.FairHeldForSubject(tool, "alice")} {
		if err := alice.Publish(s, []byte(`[{"tenant":"bob","queued":99}]`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := alice.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := heard.NextMsg(5 * time.Second)
	if err != nil || m.Subject != events.FairHeldForSubject(tool, "alice") {
		t.Errorf("control: the core hears alice's publish on her own view: %v %v", m, err)
	}
	if m, err := heard.NextMsg(300 * time.Millisecond); err == nil {
		t.Errorf("HOLE: alice's publish reached the core on %s", m.Subject)
	}
	_ = heard.Unsubscribe()
	// The answer to a core stream's subject as the reply: it comes back in alice's
	// account, and the core stores nothing.
	reply := events.SubjectToolFinished("held-bob", tool)
	back, err := alice.SubscribeSync(reply)
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.PublishRequest(events.FairHeldForSubject(tool, "alice"), reply, []byte(probeMark)); err != nil {
		t.Fatal(err)
	}
	if _, err := back.NextMsg(5 * time.Second); err != nil {
		t.Errorf("control: the scheduler's answer to alice's reply subject %s did not come back to her: %v", reply, err)
	}
	if d.exists(events.DefaultStream, reply) {
		t.Errorf("HOLE: the scheduler's answer to alice, with %s as its reply, is stored in the core", reply)
	}
	// A forged answer: alice publishes one on every reply subject of her account while
	// bob asks; his answer is the scheduler's.
	for range 20 {
		_ = alice.Publish("_INBOX.x", []byte(`[{"tenant":"bob","queued":99}]`))
		_ = alice.Publish("_R_.x", []byte(`[{"tenant":"bob","queued":99}]`))
	}
	if got := askWithin(t, bob, events.FairHeldForSubject(tool, "bob"), "", 5*time.Second); len(got) != 1 || strings.Contains(string(got[0].Data), "99") {
		t.Errorf("HOLE (or control): bob's view while alice forges answers: %s", show(got))
	}
}
