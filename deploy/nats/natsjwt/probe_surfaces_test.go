package natsjwt_test

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/seal"
)

// An outsider holding one tenant's generated credentials (team alpha's executor, client
// alice bound to her identity) against the surfaces added with fair share and signed
// events, on a deployment with fair share on (the core's scheduler running, bob's calls
// of beta's tool held at its cap) and the signers' bucket published:
//   - asks the scheduler what it holds (toolbus_fair.held.<tool>: the other tenants'
//     names and counts): no answer; the core gets bob's held calls (control); pulls
//     the scheduler's durable of every staged call: nothing (the core finds it);
//   - asks, publishes into and forges each identity's view (heldViewProbes);
//   - writes a tool.requested (its own tool's too), and publishes calls onto another
//     tool's staging and queue subjects, and its own tool's, with a forged Toolbus-Call-Subject or Nats-Stream-Source header, directly
//     and through its write import (as a start, a result): nothing is stored in the
//     queue stream, the writes with the headers are refused, the same writes without
//     them pass (control), and beta still gets bob's released call with the core's
//     header (control);
//   - writes a public key of its choosing into the signers' bucket (toolbus_signers,
//     which `toolbus replay --verify` trusts), as a key write and through the JetStream
//     API it reaches, and reads the bucket: refused or unanswered, the bucket unchanged;
//     the administrator's publish is read back (control).
func TestOutsiderFairShareAndSigners(t *testing.T) {
	ctx, d := startOutsiders(t, "alice", "bob")
	bus := d.coreBus(events.Config{FairShare: true})
	runScheduler(t, ctx, bus)
	for i := range 3 {
		tr := toolbus.ToolRequested{RunID: fmt.Sprintf("rb%d", i), CallCount: 1, Principal: toolbus.Principal{ID: "bob"},
			Call: toolbus.ToolCall{CallID: "c1", Tool: "search", Arguments: `{"q":"` + secretMark + `"}`}}
		if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("test", tr, true)); err != nil {
			t.Fatal(err)
		}
	}
	alpha, _ := d.team("alpha")
	beta, _ := d.team("beta")
	alice := d.conn(natsjwt.ClientUser("alice"))
	conns := map[string]*nats.Conn{"alpha": alpha, "alice": alice}

	// What the scheduler holds: the core's control, then the outsiders.
	core := d.conn("admin")
	eventstest.Eventually(t, 30*time.Second, func() error {
		got := askWithin(t, core, events.FairHeldSubject("search"), "", 5*time.Second)
		if len(got) == 0 || !strings.Contains(string(got[0].Data), `"tenant":"bob"`) || !strings.Contains(string(got[0].Data), `"queued":2`) {
			return fmt.Errorf("control: the core asks what the scheduler holds of search: %s", show(got))
		}
		return nil
	})
	for who, nc := range conns {
		for _, tool := range []string{"search", "calc", "*"} {
			if got := askWithin(t, nc, events.FairHeldPrefix+"."+tool, "", time.Second); len(got) > 0 {
				t.Errorf("HOLE: %s asked what the scheduler holds of %s: %s", who, tool, show(got))
			}
		}
	}
	heldViewProbes(t, ctx, d, bus, "calc", alpha, alice, d.conn(natsjwt.ClientUser("bob")))

	// The scheduler's durable on the staged calls (every tenant's, of every tool): the
	// core finds it (control); an outsider's pull of it, in its API's shape and as a
	// "+NXT" on acknowledgement shapes naming it, gets nothing.
	if got := askWithin(t, core, "$JS.API.CONSUMER.INFO."+events.QueueStreamName(events.DefaultStream)+"."+events.FairConsumer, "", 5*time.Second); len(got) == 0 || !strings.Contains(string(got[0].Data), `"name":"fair"`) {
		t.Fatalf("control: the core's info of the scheduler's durable: %s", show(got))
	}
	// The core's own pull of it is answered (a status, nothing pending): the probe below
	// would see such an answer.
	if got := askWithin(t, core, "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.fair", `{"batch":1,"no_wait":true}`, 5*time.Second); len(got) == 0 || strings.Contains(string(got[0].Data), `"error"`) {
		t.Fatalf("control: the core's pull of the scheduler's durable: %s", show(got))
	}
	for who, nc := range conns {
		for _, p := range [][2]string{
			{natsjwt.CoreAPIPrefix + ".CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.fair", `{"batch":10,"expires":500000000}`},
			{"$JS.API.CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.fair", `{"batch":10,"expires":500000000}`},
			{"$JS.ACK.TOOLBUS_QUEUES.fair.1.1.1.0.0", `+NXT {"batch":10,"expires":500000000}`},
			{"$JS.ACK._." + eventstest.AckHash(d.res.Account) + ".TOOLBUS_QUEUES.fair.1.1.1.0.0.x", `+NXT {"batch":10,"expires":500000000}`},
		} {
			if got := askWithin(t, nc, p[0], p[1], time.Second); carries(got, secretMark) || len(got) > 0 && !strings.Contains(string(got[0].Data), `"error"`) {
				t.Errorf("HOLE: %s's pull of the scheduler's durable on %s: %s", who, p[0], show(got))
			}
		}
	}

	// Calls put onto the staging and queue subjects, with forged headers.
	forged := nats.Header{events.FairCallSubjectHeader: {events.SubjectToolRequested("rb0", "search")}}
	for who, nc := range conns {
		for _, subj := range []string{events.SubjectStage("search"), events.SubjectQueue("search"), events.SubjectStage("calc"), events.SubjectQueue("calc"),
			"$JS.API.STREAM.MSG.GET.TOOLBUS_QUEUES", natsjwt.CoreAPIPrefix + ".STREAM.MSG.GET.TOOLBUS_QUEUES"} {
			m := &nats.Msg{Subject: subj, Reply: nc.NewRespInbox(), Header: forged, Data: []byte(`{"mark":"` + probeMark + `","seq":1}`)}
			sub, err := nc.SubscribeSync(m.Reply)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
			// Its own account's server answers its JetStream API with an error (no
			// JetStream there); anything else is an answer from the core.
			if a, err := sub.NextMsg(300 * time.Millisecond); err == nil && (!strings.Contains(string(a.Data), `"error"`) || strings.Contains(string(a.Data), secretMark)) {
				t.Errorf("HOLE: %s's publish on %s was answered: %q", who, subj, a.Data)
			}
			_ = sub.Unsubscribe()
		}
	}
	// Through the write imports: a start and a result carrying the scheduler's header,
	// or the server's source header, are refused; the same writes without them pass.
	writes := []struct{ who, subject, data string }{
		{"alice", events.SubjectRunStarted("ra-probe", "alice"), `{"run_id":"ra-probe","mark":"` + probeMark + `"}`},
		{"alpha", events.SubjectToolFinished("rb0", "calc"), `{"run_id":"rb0","mark":"` + probeMark + `"}`},
	}
	for _, h := range []string{events.FairCallSubjectHeader, "Nats-Stream-Source", events.FairStagedHeader, events.FairLowHeader} {
		for _, w := range writes {
			m := &nats.Msg{Subject: w.subject, Header: nats.Header{h: {events.SubjectToolRequested("rb0", "search")}}, Data: []byte(w.data)}
			a, err := conns[w.who].RequestMsg(m, 5*time.Second)
			if err != nil || !strings.Contains(string(a.Data), fmt.Sprintf(`"err_code":%d`, events.WriteRefusedErrCode)) {
				t.Errorf("HOLE: %s's write on %s with %s is not refused: %v %q", w.who, w.subject, h, err, dataOf(a))
			}
		}
	}
	// A call of its own: a team's tool.requested of its own tool (staged, it would count
	// as any principal's call it names), a client's of any tool. Refused.
	for _, w := range []struct{ who, subject string }{
		{"alpha", events.SubjectToolRequested("rb0", "calc")},
		{"alpha", events.SubjectToolRequested("rb0", "search")},
		{"alice", events.SubjectToolRequested("ra-probe", "calc")},
		{"alice", events.SubjectToolRequested("ra-probe", "alice")},
	} {
		body := `{"run_id":"rb0","call":{"call_id":"c9","tool":"calc"},"principal":{"id":"bob"},"mark":"` + probeMark + `"}`
		a, err := conns[w.who].Request(w.subject, []byte(body), 2*time.Second)
		if err == nil && !strings.Contains(string(a.Data), fmt.Sprintf(`"err_code":%d`, events.WriteRefusedErrCode)) {
			t.Errorf("HOLE: %s's call on %s is not refused: %q", w.who, w.subject, a.Data)
		}
	}
	for _, w := range writes {
		if a, err := conns[w.who].Request(w.subject, []byte(w.data), 5*time.Second); err != nil || !strings.Contains(string(a.Data), `"seq"`) {
			t.Errorf("control: %s's plain write on %s: %v %q", w.who, w.subject, err, dataOf(a))
		}
	}
	qs, err := d.core.Stream(ctx, events.QueueStreamName(events.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{events.SubjectStage("search"), events.SubjectQueue("search"), events.SubjectStage("calc"), events.SubjectQueue("calc")} {
		if m, err := qs.GetLastMsgForSubject(ctx, subj); err == nil && strings.Contains(string(m.Data), probeMark) {
			t.Errorf("HOLE: an outsider's call is stored on %s: %q", subj, m.Data)
		}
	}
	// Beta gets bob's call as the scheduler released it, naming its real subject.
	if m, err := pullCall(beta, "search", 10*time.Second); err != nil || !strings.Contains(string(m.Data), secretMark) ||
		!strings.HasPrefix(m.Header.Get(events.FairCallSubjectHeader), "toolbus.rb") {
		t.Errorf("control: beta's pull of its queue: %v %v", m, err)
	}

	// The signers' bucket: the administrator publishes beta's key (the control reads it
	// back); the outsiders try to add theirs.
	betaKey, err := seal.NewKeyFile("team.beta")
	if err != nil {
		t.Fatal(err)
	}
	ring := seal.Keyring{Keys: []seal.Key{{KeyID: betaKey.KeyID, Signer: "team.beta", Public: betaKey.Public(), Created: time.Now(),
		Tools: map[string][]seal.Span{"search": {{From: time.Now()}}}}}}
	if _, err := seal.PublishKeyring(ctx, d.core, ring); err != nil {
		t.Fatal(err)
	}
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	for who, nc := range conns {
		id := seal.KeyID("team.beta", pub)
		k, _ := json.Marshal(seal.Key{KeyID: id, Signer: "team.beta", Public: pub, Created: time.Unix(0, 0),
			Tools: map[string][]seal.Span{"search": {{From: time.Unix(0, 0)}}, "*": {{From: time.Unix(0, 0)}}}})
		for _, p := range []struct{ subject, body string }{
			{"$KV." + seal.BucketSigners + "." + id, string(k)},
			{"$KV." + seal.BucketSigners + "." + betaKey.KeyID, string(k)},
			{natsjwt.CoreAPIPrefix + ".STREAM.MSG.DELETE.KV_" + seal.BucketSigners, `{"seq":1}`},
			{natsjwt.CoreAPIPrefix + ".DIRECT.GET.KV_" + seal.BucketSigners, `{"seq":1}`},
			{natsjwt.CoreAPIPrefix + ".STREAM.PURGE.KV_" + seal.BucketSigners, `{}`},
			{natsjwt.CoreAPIPrefix + ".STREAM.UPDATE.KV_" + seal.BucketSigners, `{}`},
		} {
			got := askWithin(t, nc, p.subject, p.body, time.Second)
			if len(got) > 0 && !strings.Contains(string(got[0].Data), fmt.Sprintf(`"err_code":%d`, events.WriteRefusedErrCode)) {
				t.Errorf("HOLE: %s on %s was answered: %s", who, p.subject, show(got))
			}
		}
	}
	after, err := seal.LoadKeyring(ctx, d.core)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Keys) != 1 || after.Keys[0].KeyID != betaKey.KeyID || !after.Keys[0].Public.Equal(betaKey.Public()) {
		t.Errorf("HOLE (or control): the signers' bucket holds %+v, want only the administrator's key of beta", after.Keys)
	}
}
