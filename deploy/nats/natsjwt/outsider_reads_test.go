package natsjwt_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// An outsider holding team alpha's executor credentials asks the core's read service
// the state of a question of its tool (toolbus_toolread.calc.question) naming a run of
// bob's that never called calc: a run of many events. The service reads with the core's
// authority, so what one request makes it read is what a team's flood of them costs the
// core (16 at once per tool, each a whole run): a run that never requested the tool is
// answered from one read, not from its every event. The control: alpha's question in a
// run that called calc is answered, asked. Client alice's follows of bob's run are
// answered as an absent run's before the service asks anything of the core's JetStream
// API (a stream info, on the server's one info queue); her follow of her own run is
// answered (the control).
func TestOutsiderReadsOfAnotherRun(t *testing.T) {
	ctx, d := startOutsiders(t, "alice")
	bus := d.coreBus(events.Config{})
	serveReads(t, ctx, d, bus)
	alpha, _ := d.team("alpha")
	publish := func(env events.Envelope) {
		t.Helper()
		if _, err := bus.PublishEvent(ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	publish(events.ToolRequestedEvent("test", toolbus.ToolRequested{RunID: "ra", CallCount: 1, Call: toolbus.ToolCall{CallID: "c1", Tool: "calc"}}, true))
	publish(events.ToolQuestionEvent("test", toolbus.ToolQuestion{RunID: "ra", CallID: "c1", Tool: "calc", Seq: 1, Message: "sure?"}))
	const logs = 300
	for i := range logs {
		publish(events.ToolLogEvent("test", toolbus.ToolLog{RunID: "rb", CallID: "c1", Tool: "search", Seq: i + 1, Message: secretMark}))
	}
	ask := func(run string) (events.QuestionState, int64) {
		t.Helper()
		before := serverIn(t, d)
		body, _ := json.Marshal(events.QuestionQuery{RunID: run, CallID: "c1", Seq: 1})
		m, err := alpha.RequestWithContext(ctx, events.ToolQuestionSubject("calc"), body)
		if err != nil {
			t.Fatalf("alpha's question read of %s: %v", run, err)
		}
		var st events.QuestionState
		if err := json.Unmarshal(m.Data, &st); err != nil {
			t.Fatalf("%q: %v", m.Data, err)
		}
		return st, serverIn(t, d) - before
	}
	if st, _ := ask("ra"); !st.Asked || st.Error != "" {
		t.Fatalf("control: alpha's question in a run that called calc: %+v", st)
	}
	st, cost := ask("rb")
	if st.Asked || st.Error == "" {
		t.Errorf("HOLE: alpha's question read of bob's run is answered: %+v", st)
	}
	if cost > logs/10 {
		t.Errorf("HOLE: alpha's one question read of bob's run of %d events cost the core %d messages", logs, cost)
	}

	alice := d.client("alice", "alice")
	for run, who := range map[string]string{"ra": "alice", "rb": "bob"} {
		if err := bus.StartRun(ctx, "test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: who}}); err != nil {
			t.Fatal(err)
		}
	}
	follow := func(run string) *nats.Msg {
		t.Helper()
		got := askWithin(t, alice, events.FollowSubject("alice", run), "", 10*time.Second)
		if len(got) == 0 {
			t.Fatalf("alice's follow of %s: no answer", run)
		}
		return got[0]
	}
	if m := follow("ra"); m.Header.Get("Status") != events.FollowIdle {
		t.Fatalf("control: alice's follow of her run: %v", m.Header)
	}
	before := apiTotal(t, d)
	const follows = 30
	for range follows {
		if m := follow("rb"); m.Header.Get("Status") != "404" {
			t.Fatalf("HOLE: alice's follow of bob's run: %v %q", m.Header, m.Data)
		}
	}
	if n := apiTotal(t, d) - before; n > follows/10 {
		t.Errorf("HOLE: alice's %d follows of bob's run cost the core %d JetStream API requests", follows, n)
	}
}

// apiTotal is the JetStream API requests the server answered so far.
func apiTotal(t *testing.T, d *accountsDeployment) uint64 {
	t.Helper()
	js, err := d.srv.Jsz(nil)
	if err != nil {
		t.Fatal(err)
	}
	return js.API.Total
}

// serverIn is the messages the server received so far.
func serverIn(t *testing.T, d *accountsDeployment) int64 {
	t.Helper()
	v, err := d.srv.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	return v.InMsgs
}
