package natsjwt_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/eventstest"
)

// secretMark marks every datum of another tenant (beta's, bob's) and of the core: no
// answer to an outsider's probe may carry it. ownMark marks the attacker's own data,
// which the controls must find.
const (
	secretMark = "SECRET-of-another"
	ownMark    = "own-of-attacker"
)

// An outsider, holding only one tenant's generated credentials (team alpha's executor,
// or client alice bound to her identity), tries every route NATS offers through the
// imports of its account (accounts.TeamExports, accounts.ClientExports) to read,
// suppress or forge another tenant's work: crafted bodies and subject tails on the
// direct gets it may ask (wildcard tokens, next/last/multi/batch/time fields), crafted
// pull requests, crafted acknowledgement tokens and bodies on its own queue's ack
// subjects naming other messages' sequences, writes with wildcard tokens, reads naming
// another identity or another's run through wildcard shapes, and a flood of its read
// service. No answer carries another's datum, nothing is stored, and beta's call is
// still delivered to beta afterwards; the same probes with the owner's names find the
// owner's data (the controls).
func TestOutsiderProbes(t *testing.T) {
	// One deployment for every probe: the JWT kind (the generated credentials), the
	// core set up without a read mirror (so that the event stream answers the direct
	// gets a team imports), the write service (startAccounts) and the read service.
	ctx, d := startOutsiders(t, "alice", "bob")
	res := d.res
	bus := d.coreBus(events.Config{})
	serveReads(t, ctx, d, bus)
	start := func(run, principal, content string) {
		t.Helper()
		if err := bus.StartRun(ctx, "test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: principal},
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: content}}}); err != nil {
			t.Fatal(err)
		}
	}
	start("ra", "alice", ownMark+" alice's prompt")
	start("rb", "bob", secretMark+" bob's prompt")
	for _, p := range [][2]string{
		{events.SubjectToolRequested("ra", "calc"), ownMark + " calc args"},
		{events.SubjectToolRequested("rb", "search"), secretMark + " search args"},
		{events.SubjectToolFinished("ra", "calc"), ownMark + " calc result"},
		{events.SubjectToolFinished("rb", "search"), secretMark + " search result"},
		{"$KV.toolbus_claims.calc.ra.0.c1", ownMark},
		{"$KV.toolbus_claims.search.rb.0.c1", secretMark},
		{"$KV.toolbus_secrets.alpha.oauth", ownMark},
		{"$KV.toolbus_secrets.beta.oauth", secretMark},
		{"$KV.toolbus_instances.alpha.i1.b1", ownMark},
		{"$KV.toolbus_instances.beta.i1.b1", secretMark},
		{"$KV.toolbus_tools.calc", `{"mark":"` + ownMark + `"}`},
		{"$KV.toolbus_tools.search", `{"mark":"` + secretMark + `"}`},
		{"$KV.toolbus_outputs.calc.ra.out", ownMark},
		{"$KV.toolbus_outputs.search.rb.out", secretMark},
		{"$KV.toolbus_runs.rb", secretMark},
	} {
		d.put(p[0], `"`+p[1]+`"`)
	}
	alpha, _ := d.team("alpha")
	beta, _ := d.team("beta")
	alice := d.conn(natsjwt.ClientUser("alice"))
	bob := d.conn(natsjwt.ClientUser("bob"))

	api := natsjwt.CoreAPIPrefix
	read := events.ReadAPIPrefix("alice")
	ownClaims := api + ".DIRECT.GET.KV_toolbus_claims.$KV.toolbus_claims.calc"
	ownSecrets := api + ".DIRECT.GET.KV_toolbus_secrets.$KV.toolbus_secrets.alpha"
	ownResult := api + ".DIRECT.GET.TOOLBUS." + events.SubjectToolFinished("ra", "calc")
	// The server's direct-get fields that reach beyond the key of the subject form.
	bodies := []string{`{"seq":1}`, `{"seq":1,"next_by_subj":">"}`, `{"last_by_subj":">"}`, `{"multi_last":[">"]}`,
		`{"multi_last":[">"],"batch":100}`, `{"start_time":"2000-01-01T00:00:00Z"}`, `{"batch":100}`, `{"up_to_seq":1000}`,
		`{"next_by_subj":"$KV.toolbus_claims.search.>"}`, `{"last_by_subj":"toolbus.rb.tool.requested.search"}`}
	type probe struct {
		name, who, subject, body string
		// own: the control; the answer must carry ownMark.
		own bool
	}
	probes := []probe{
		// Direct gets through the team's own imports: controls, then shapes beyond them.
		{name: "own result by subject", who: "alpha", subject: ownResult, own: true},
		{name: "own tool's results, any run", who: "alpha", subject: api + ".DIRECT.GET.TOOLBUS.toolbus.*.tool.finished.calc", own: true},
		{name: "a > in the run's token", who: "alpha", subject: api + ".DIRECT.GET.TOOLBUS.toolbus.>.tool.finished.calc"},
		{name: "own claim", who: "alpha", subject: ownClaims + ".ra.0.c1", own: true},
		{name: "own claims, >", who: "alpha", subject: ownClaims + ".>", own: true},
		{name: "own claims, > then more", who: "alpha", subject: ownClaims + ".>.c1"},
		{name: "own secret", who: "alpha", subject: ownSecrets + ".oauth", own: true},
		{name: "own secrets, >", who: "alpha", subject: ownSecrets + ".>", own: true},
		{name: "own instance", who: "alpha", subject: api + ".DIRECT.GET.KV_toolbus_instances.$KV.toolbus_instances.alpha.i1.b1", own: true},
		{name: "own catalog entry", who: "alpha", subject: api + ".DIRECT.GET.KV_toolbus_tools.$KV.toolbus_tools.calc", own: true},
		// A pull of its own queue with every field a pull request takes.
		{name: "pull with crafted fields", who: "alpha", subject: api + ".CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.tool_calc",
			body: `{"batch":1000,"max_bytes":1,"expires":100000000,"idle_heartbeat":10000000,"no_wait":true,"group":"g","min_pending":1,"min_ack_pending":1,"id":"x","priority":9}`},
		{name: "own queue info", who: "alpha", subject: api + ".CONSUMER.INFO.TOOLBUS_QUEUES.tool_calc"},
		// The read service: a client's control, then another's run by every shape.
		{name: "own run", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS." + events.SubjectRunStarted("ra", "alice"), own: true},
		{name: "own run, body", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS", body: `{"seq":1,"next_by_subj":"toolbus.ra.>"}`, own: true},
		{name: "own output", who: "alice", subject: read + ".DIRECT.GET.KV_toolbus_outputs", body: `{"last_by_subj":"$KV.toolbus_outputs.*.ra.>"}`, own: true},
		{name: "bob's run", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS." + events.SubjectRunStarted("rb", "bob")},
		{name: "bob's run, any", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS.toolbus.rb.>"},
		{name: "a > before the run", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS", body: `{"last_by_subj":"toolbus.>.rb"}`},
		{name: "a > then own run", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS", body: `{"seq":1,"next_by_subj":"toolbus.>.ra"}`},
		{name: "outputs, > then own run", who: "alice", subject: read + ".DIRECT.GET.KV_toolbus_outputs", body: `{"seq":1,"next_by_subj":"$KV.toolbus_outputs.>.ra"}`},
		{name: "outputs, > then own run, last", who: "alice", subject: read + ".DIRECT.GET.KV_toolbus_outputs", body: `{"last_by_subj":"$KV.toolbus_outputs.>.ra"}`},
		{name: "outputs, own run then >", who: "alice", subject: read + ".DIRECT.GET.KV_toolbus_outputs", body: `{"seq":1,"next_by_subj":"$KV.toolbus_outputs.search.ra.>"}`},
		{name: "runs bucket, own run and >", who: "alice", subject: read + ".DIRECT.GET.KV_toolbus_runs", body: `{"seq":1,"next_by_subj":"$KV.toolbus_runs.ra.>"}`},
		{name: "seq with last", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS", body: `{"seq":1,"last_by_subj":"toolbus.ra.>"}`},
		{name: "unknown fields", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS", body: `{"seq":1,"next_by_subj":"toolbus.ra.>","multi_last":["toolbus.>"]}`},
		{name: "the catalog, another tool", who: "alice", subject: read + ".DIRECT.GET.KV_toolbus_tools", body: `{"seq":1,"next_by_subj":"$KV.toolbus_tools.>"}`},
		{name: "secrets", who: "alice", subject: read + ".DIRECT.GET.KV_toolbus_secrets.$KV.toolbus_secrets.beta.oauth"},
		{name: "claims", who: "alice", subject: read + ".DIRECT.GET.KV_toolbus_claims", body: `{"seq":1,"next_by_subj":">"}`},
		{name: "the queues", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS_QUEUES", body: `{"seq":1,"next_by_subj":">"}`},
		{name: "the read mirror", who: "alice", subject: read + ".DIRECT.GET.TOOLBUS_READ", body: `{"seq":1,"next_by_subj":"toolbus.rb.>"}`},
		{name: "stream info", who: "alice", subject: read + ".STREAM.INFO.TOOLBUS"},
		{name: "stream info of the secrets", who: "alice", subject: read + ".STREAM.INFO.KV_toolbus_secrets"},
		{name: "consumer create", who: "alice", subject: read + ".CONSUMER.CREATE.TOOLBUS", body: `{"stream_name":"TOOLBUS","config":{"ack_policy":"none"}}`},
		{name: "the run list", who: "alice", subject: events.ReadSubject("alice") + ".runs"},
		{name: "bob's read subject", who: "alice", subject: events.ReadAPIPrefix("bob") + ".DIRECT.GET.TOOLBUS." + events.SubjectRunStarted("rb", "bob")},
		{name: "the no-identity read subject", who: "alice", subject: events.ReadAPIPrefix("") + ".DIRECT.GET.TOOLBUS", body: `{"seq":1,"next_by_subj":"toolbus.rb.>"}`},
		{name: "a team's question read of another tool", who: "alpha", subject: events.ToolQuestionSubject("search"),
			body: `{"run_id":"rb","step":0,"call_id":"c1","seq":1}`},
		{name: "its own question read naming beta's call", who: "alpha", subject: events.ToolQuestionSubject("calc"),
			body: `{"run_id":"rb","step":0,"call_id":"c1","seq":1}`},
	}
	for _, subject := range []string{ownResult, ownClaims + ".ra.0.c1", ownSecrets + ".oauth", ownClaims + ".>", ownSecrets + ".>",
		api + ".DIRECT.GET.KV_toolbus_tools.$KV.toolbus_tools.calc"} {
		for _, b := range bodies {
			probes = append(probes, probe{name: "direct get with a body", who: "alpha", subject: subject, body: b})
		}
	}
	conns := map[string]*nats.Conn{"alpha": alpha, "alice": alice}
	for _, p := range probes {
		// An answer comes at once; a control may wait longer on a busy machine.
		wait := time.Second
		if p.own {
			wait = 10 * time.Second
		}
		got := askWithin(t, conns[p.who], p.subject, p.body, wait)
		if carries(got, secretMark) {
			t.Errorf("HOLE %s: %s on %s %s was answered with another's data: %s", p.name, p.who, p.subject, p.body, show(got))
		}
		if p.own && !carries(got, ownMark) {
			t.Errorf("control %s: %s on %s %s did not find its own data: %s", p.name, p.who, p.subject, p.body, show(got))
		}
		t.Logf("%s: %s %s %s -> %s", p.name, p.who, p.subject, p.body, show(got))
	}
	// Acknowledgements with crafted tokens and bodies: alpha takes its own call (the
	// control), then sends every acknowledgement body on its own queue's ack subjects,
	// in both of the server's shapes, naming the sequence of beta's call in the queue
	// stream. None hands it beta's call, and beta still gets it afterwards.
	qs, err := d.core.Stream(ctx, events.QueueStreamName(events.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	var betaSeq uint64
	eventstest.Eventually(t, 30*time.Second, func() error {
		m, err := qs.GetLastMsgForSubject(ctx, events.SubjectQueue("search"))
		if err != nil {
			return err
		}
		betaSeq = m.Sequence
		return nil
	})
	own := askWithin(t, alpha, api+".CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.tool_calc", `{"batch":1,"expires":5000000000}`, 10*time.Second)
	if !carries(own, ownMark) || len(own) == 0 || !strings.HasPrefix(own[0].Reply, "$JS.ACK.") {
		t.Fatalf("control: alpha's pull of its own queue: %s", show(own))
	}
	hash := eventstest.AckHash(res.Account)
	seq := fmt.Sprint(betaSeq)
	for _, subject := range []string{
		"$JS.ACK.TOOLBUS_QUEUES.tool_calc.1." + seq + ".1.0.0",
		"$JS.ACK._." + hash + ".TOOLBUS_QUEUES.tool_calc.1." + seq + ".1.0.0",
		"$JS.ACK.x.y.TOOLBUS_QUEUES.tool_calc.1." + seq + ".1.0.0.extra.more",
		"$JS.ACK.TOOLBUS_QUEUES.tool_calc.1." + seq + ".99.0.0",
	} {
		for _, body := range []string{"+ACK", "+TERM stolen", "-NAK", `-NAK {"delay":3600000000000}`, "+WPI",
			`+NXT {"batch":10,"expires":300000000}`, `+NXT {"batch":1,"no_wait":true}`, "+ACK " + seq, ""} {
			if got := askWithin(t, alpha, subject, body, 100*time.Millisecond); carries(got, secretMark) {
				t.Errorf("HOLE: alpha's %q on %s was handed beta's call: %s", body, subject, show(got))
			}
		}
	}
	if m, err := pullCall(beta, "search", 10*time.Second); err != nil || !strings.Contains(string(m.Data), secretMark) {
		t.Errorf("HOLE: beta's call was suppressed by alpha's acknowledgements: beta got %v (%v)", m, err)
	}

	// Writes with wildcard tokens where the imports leave a token free, and a client's
	// start of another's run id: refused, nothing stored. The control: alpha's plain
	// write of its own claim is stored.
	for _, w := range []struct{ who, subject string }{
		{"alpha", "toolbus.*.tool.finished.calc"},
		{"alpha", "toolbus.>.tool.finished.calc"},
		{"alpha", "toolbus..tool.finished.calc"},
		{"alpha", "$KV.toolbus_claims.calc.>"},
		{"alpha", "$KV.toolbus_claims.calc.*"},
		{"alpha", "$KV.toolbus_claims.calc.ra.*.c1"},
		{"alpha", "$KV.toolbus_outputs.calc.>"},
		{"alpha", "$KV.toolbus_instances.alpha.>"},
		{"alpha", "$KV.toolbus_secrets.alpha.*"},
		{"alice", "toolbus.*.run.started.alice"},
		{"alice", "toolbus.>.run.cancel.alice"},
		{"alice", "toolbus.*.approval.granted.alice"},
		{"alice", "toolbus.>.tool.answer.alice"},
		{"alice", events.SubjectRunStarted("rb", "alice")},
	} {
		got := askWithin(t, conns[w.who], w.subject, `{"run_id":"rb","mark":"forged-wild"}`, 2*time.Second)
		if w.subject == events.SubjectRunStarted("rb", "alice") {
			continue // a form a client may write; the injector and the reads keep the first
		}
		// Refused by the write service, or (an empty token) not delivered at all.
		if len(got) > 0 && !strings.Contains(string(got[0].Data), fmt.Sprintf(`"err_code":%d`, events.WriteRefusedErrCode)) {
			t.Errorf("HOLE: %s's write on %s is not refused: %s", w.who, w.subject, show(got))
		}
	}
	if got := askWithin(t, alpha, "$KV.toolbus_claims.calc.ra.0.c9", `"`+ownMark+`"`, 5*time.Second); len(got) == 0 || strings.Contains(string(got[0].Data), "error") {
		t.Errorf("control: alpha's write of its own claim: %s", show(got))
	}
	for _, name := range []string{events.DefaultStream, "KV_toolbus_claims", "KV_toolbus_outputs", "KV_toolbus_instances", "KV_toolbus_secrets"} {
		st, err := d.core.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		for subj := range info.State.Subjects {
			for _, tok := range strings.Split(subj, ".") {
				if tok == "*" || tok == ">" {
					t.Errorf("HOLE: a tenant's write stored %s in %s", subj, name)
				}
			}
		}
		if name == "KV_toolbus_claims" && info.State.Subjects["$KV.toolbus_claims.calc.ra.0.c9"] == 0 {
			t.Errorf("control: alpha's own claim is not stored: %v", info.State.Subjects)
		}
	}
	if got := askWithin(t, alice, read+".DIRECT.GET.TOOLBUS.toolbus.rb.>", "", 2*time.Second); carries(got, secretMark) {
		t.Errorf("HOLE: after alice's start of bob's run id, she reads it: %s", show(got))
	}

	// The stream imports: a run-ended notice or a call that alpha publishes on beta's
	// subjects stays in alpha's account; the core's reaches beta (the control).
	heard, err := beta.SubscribeSync(events.FilterRunEndedFor("search"))
	if err != nil {
		t.Fatal(err)
	}
	bell, err := beta.SubscribeSync(events.FilterToolRequestedFor("search"))
	if err != nil {
		t.Fatal(err)
	}
	if err := beta.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{events.SubjectRunEndedFor("rb", "search"), events.SubjectToolRequested("rb", "search")} {
		if err := alpha.Publish(subj, []byte("forged by alpha")); err != nil {
			t.Fatal(err)
		}
	}
	if err := alpha.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := d.core.Conn().Publish(events.SubjectRunEndedFor("rb", "search"), []byte("the core's notice")); err != nil {
		t.Fatal(err)
	}
	if m, err := heard.NextMsg(10 * time.Second); err != nil || string(m.Data) != "the core's notice" {
		t.Errorf("beta's notices: want the core's first, got %v %q", err, dataOf(m))
	}
	if m, err := bell.NextMsg(300 * time.Millisecond); err == nil {
		t.Errorf("HOLE: alpha rang beta's doorbell: %s %q", m.Subject, m.Data)
	}

	// A pull and a "+NXT" whose reply subject is one of alpha's own write imports: the
	// server answers in alpha's account (its subscription there gets the call), and no
	// import carries the answer on into the core's write service.
	d.put(events.SubjectToolRequested("rc", "calc"), `"`+ownMark+` rc"`)
	d.put(events.SubjectToolRequested("rd", "calc"), `"`+ownMark+` rd"`)
	for i, r := range []struct{ subject, body, reply string }{
		{api + ".CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.tool_calc", `{"batch":1,"expires":5000000000}`, events.SubjectToolFinished("rc", "calc")},
		{"$JS.ACK.TOOLBUS_QUEUES.tool_calc.0.0.0.0.0", `+NXT {"batch":1,"expires":5000000000}`, "$KV.toolbus_claims.calc.rd.0.c1"},
	} {
		sub, err := alpha.SubscribeSync(r.reply)
		if err != nil {
			t.Fatal(err)
		}
		if err := alpha.PublishRequest(r.subject, r.reply, []byte(r.body)); err != nil {
			t.Fatal(err)
		}
		if m, err := sub.NextMsg(10 * time.Second); err != nil || !strings.Contains(string(m.Data), ownMark) {
			t.Errorf("control: alpha's pull %d was not answered on its own %s: %v %q", i, r.reply, err, dataOf(m))
		}
		_ = sub.Unsubscribe()
	}
	for stream, subject := range map[string]string{events.DefaultStream: events.SubjectToolFinished("rc", "calc"), "KV_toolbus_claims": "$KV.toolbus_claims.calc.rd.0.c1"} {
		st, err := d.core.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := st.GetLastMsgForSubject(ctx, subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("HOLE: a pull's answer to alpha's write import was stored in the core: %v %v", m, err)
		}
	}

	// A flood of alice's reads delays nobody else's: bob reads his run at once.
	for i := 0; i < 500; i++ {
		if err := alice.PublishRequest(read+".DIRECT.GET.TOOLBUS", "flood.inbox", []byte(`{"seq":1,"next_by_subj":"toolbus.ra.>"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := alice.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := askWithin(t, bob, events.ReadAPIPrefix("bob")+".DIRECT.GET.TOOLBUS."+events.SubjectRunStarted("rb", "bob"), "", 10*time.Second); !carries(got, secretMark) {
		t.Errorf("bob's read during alice's flood: %s", show(got))
	}
}

// askWithin sends a request as nc and returns every answer: the first within wait, the
// others while they come at once (a pull or a multi get sends several).
func askWithin(t *testing.T, nc *nats.Conn, subject, body string, wait time.Duration) []*nats.Msg {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, []byte(body)); err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for {
		m, err := sub.NextMsg(wait)
		if err != nil {
			return out
		}
		out = append(out, m)
		wait = 50 * time.Millisecond
	}
}

// carries reports whether an answer's data or headers hold mark.
func carries(ms []*nats.Msg, mark string) bool {
	for _, m := range ms {
		if strings.Contains(string(m.Data), mark) || strings.Contains(fmt.Sprint(m.Header), mark) {
			return true
		}
	}
	return false
}

func show(ms []*nats.Msg) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "[%s %v %q] ", m.Subject, m.Header, m.Data)
	}
	return b.String()
}

// A team floods the JetStream API it reaches. The server answers every account's infos
// (stream, consumer, account) from one queue and drops what is over its limit, so a team
// that could ask its queue's consumer info (the import before issue 54's fix) timed out
// the core's infos and the other teams'. Now no team crossing is meant for an endpoint
// of the core's JetStream API (only pulls, acknowledgements and direct gets, which the
// consumer and the stream answer themselves; the executors learn from the pulls' answers:
// events/teamqueue), alpha's flood of its former info import reaches nothing, and
// during it beta's pull that takes nothing (teamqueue.Probe) and the core's
// consumer and stream infos are all answered. The control: the same requests before the
// flood. On the imports before the fix the core's infos failed during the flood.
func TestOutsiderAPIFloodStarvesOthers(t *testing.T) {
	for _, c := range accounts.TeamExports("alpha", []string{"calc"}) {
		if c.For.Kind == accounts.ForAPI {
			t.Errorf("a team's crossing %s reaches the core's JetStream API (%s)", c.Subject, c.For.Name)
		}
	}
	ctx, d := startOutsiders(t)
	alpha, _ := d.team("alpha")
	beta, _ := d.team("beta")
	queues := events.QueueStreamName(events.DefaultStream)
	flooded := natsjwt.CoreAPIPrefix + ".CONSUMER.INFO." + queues + "." + events.ToolConsumer("calc")
	if _, err := alpha.Request(flooded, nil, 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("alpha's consumer info of its own queue: %v, want no responders (no such import)", err)
	}
	others := func() (failed []string) {
		for i := 0; i < 10; i++ {
			m, err := beta.Request(natsjwt.CoreAPIPrefix+".CONSUMER.MSG.NEXT."+queues+"."+events.ToolConsumer("search"),
				[]byte(`{"batch":1,"max_bytes":1,"no_wait":true}`), 2*time.Second)
			if err != nil || m.Header.Get("Status") != "404" {
				failed = append(failed, fmt.Sprintf("beta's probe of its queue: %v %v", err, m))
			}
			ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if _, err := d.core.Consumer(ictx, queues, events.ToolConsumer("search")); err != nil {
				failed = append(failed, "the core's consumer info: "+err.Error())
			}
			if _, err := d.core.Stream(ictx, events.DefaultStream); err != nil {
				failed = append(failed, "the core's stream info: "+err.Error())
			}
			cancel()
		}
		return failed
	}
	if f := others(); len(f) > 0 {
		t.Fatalf("control: with no flood %d requests failed: %v", len(f), f)
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- alpha.Flush()
				return
			default:
			}
			for i := 0; i < 1000; i++ {
				if err := alpha.PublishRequest(flooded, "flood", nil); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	f := others()
	close(stop)
	if err := <-done; err != nil {
		t.Logf("alpha's flood: %v", err) // its own flush may time out behind the flood
	}
	if len(f) > 0 {
		t.Errorf("%d of 30 requests of beta and the core failed while alpha flooded: %v", len(f), f[:min(len(f), 5)])
	}
}

// One tenant's account may hold Conns x Subs subscriptions (nats-server counts
// max_subscriptions per connection, not per account), at one to three kilobytes of the
// server's memory each (measured in process, server and client). The defaults let one
// tenant hold at most a million (they let it hold ten million before), and on the real
// server with the generated credentials, with no limit given, a team's account holds
// its Conns connections and a connection its Subs subscriptions (the controls), one
// more of each is refused, and the other team still works.
func TestOutsiderTenantSubscriptionsFitAServer(t *testing.T) {
	l := accounts.DefaultTenantLimits
	if total := l.Conns * l.Subs; total > 1_000_000 {
		t.Errorf("a tenant may hold %d subscriptions (%d connections x %d each)", total, l.Conns, l.Subs)
	}
	_, d := startOutsiders(t)
	alpha := natsjwt.TeamUser("alpha")
	held := make([]*nats.Conn, 0, l.Conns)
	for i := range l.Conns {
		nc, err := d.dial(alpha)
		if err != nil {
			t.Fatalf("control: alpha's connection %d of %d: %v", i+1, l.Conns, err)
		}
		held = append(held, nc)
	}
	if _, err := d.dial(alpha); err == nil || !strings.Contains(err.Error(), "maximum account active connections exceeded") {
		t.Errorf("alpha's connection %d (cap %d): %v, want refused", l.Conns+1, l.Conns, err)
	}
	nc := held[0]
	for i := range l.Subs {
		if _, err := nc.SubscribeSync(fmt.Sprintf("fit.%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil || nc.LastError() != nil {
		t.Fatalf("control: alpha's %d subscriptions: %v %v", l.Subs, err, nc.LastError())
	}
	if _, err := nc.SubscribeSync("fit.over"); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		_ = nc.Flush()
		if err := nc.LastError(); !errors.Is(err, nats.ErrMaxSubscriptionsExceeded) {
			return fmt.Errorf("alpha's subscription %d (cap %d) is not refused: %v", l.Subs+1, l.Subs, err)
		}
		return nil
	})
	// Beta connects and works beside alpha at its caps (a connect may meet a busy server).
	var beta *nats.Conn
	eventstest.Eventually(t, 30*time.Second, func() error {
		var err error
		beta, err = d.dial(natsjwt.TeamUser("beta"))
		return err
	})
	echo(t, "beta", beta)
}
