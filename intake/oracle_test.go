package intake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/reads"
)

// send publishes data on subject from nc with the headers h (name, value pairs) and
// returns the answer: through the write service for a tenant, from the stream itself
// for the core.
func send(t *testing.T, ctx context.Context, nc *nats.Conn, subject, data string, h ...string) answer {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(data)
	for i := 0; i+1 < len(h); i += 2 {
		m.Header.Set(h[i], h[i+1])
	}
	r, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		t.Fatalf("write %s: %v", subject, err)
	}
	var a answer
	if err := json.Unmarshal(r.Data, &a); err != nil {
		t.Fatalf("write %s: %v: %s", subject, err, r.Data)
	}
	return a
}

// event is the headers of a toolbus event of id (as events.Encode writes them) with
// more headers after them.
func event(id string, more ...string) []string {
	return append([]string{"ce-specversion", "1.0", "ce-id", id, "ce-type", "toolbus.run.cancel", "ce-source", "/toolbus/test/1",
		"Content-Type", events.ContentTypeJSON}, more...)
}

// TestTenantWriteIsNoOracle: a tenant's headers are data, never an instruction to the
// stream that answers with another's ids or sequences. Alice's run holds her start (her
// conditional publish, the control that the legit flow works) and a result; client bob
// and team beta probe with every header the stream takes. Each probe is refused by the
// write service (nothing stored), or admitted as the tenant's own data and answered in
// the service's words: no probe's answer holds alice's event ids or the stream's text.
// The controls: the same headers sent by the core straight to the stream answer with
// alice's message id, her run's last sequence and a duplicate of her result, so a probe
// that learnt nothing would have learnt them without the service.
func TestTenantWriteIsNoOracle(t *testing.T) {
	srv := intaketest.StartTenants(t, map[string][]string{"alpha": {"calc"}, "beta": {"search"}},
		map[string][]string{"alice": {"alice"}, "bob": {"bob"}})
	ctx := eventstest.Context(t, time.Minute)
	core := provisionedCore(t, ctx, srv)
	js, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, events.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	stored := func(subject string) bool {
		_, err := stream.GetLastMsgForSubject(ctx, subject)
		return err == nil
	}
	alice, bob, beta := eventstest.Connect(t, srv, "alice"), eventstest.Connect(t, srv, "bob"), eventstest.Connect(t, srv, "beta")

	const run = "alice-payroll"
	secret := events.IDToolFinished(run, 0, "call-secret")
	// Alice's start, conditional as StartRun sends it: the legit flow passes.
	start := events.SubjectRunStarted(run, "alice")
	if a := send(t, ctx, alice, start, `{}`, event(events.IDRunStarted(run), "Nats-Msg-Id", events.IDRunStarted(run),
		"Nats-Expected-Last-Subject-Sequence", "0", "Nats-Expected-Last-Subject-Sequence-Subject", events.SubjectRun(run))...); a.Error != nil || a.Seq == 0 {
		t.Fatalf("alice's conditional start: %+v", a.Error)
	}
	result, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.SubjectToolFinished(run, "calc"), Header: nats.Header{"Nats-Msg-Id": {secret}}, Data: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}

	// The controls: straight to the stream, the same headers tell alice's run.
	desc := func(a answer) string {
		if a.Error == nil {
			return ""
		}
		return a.Error.Desc
	}
	if d := desc(send(t, ctx, core, "toolbus.core-probe.run.cancel.x", `{}`, "Nats-Expected-Last-Msg-Id", "x")); !strings.Contains(d, secret) {
		t.Fatalf("control: the stream's answer to Nats-Expected-Last-Msg-Id %q does not name alice's result: the probe below proves nothing", d)
	}
	if d := desc(send(t, ctx, core, "toolbus.core-probe.run.cancel.y", `{}`, "Nats-Expected-Last-Subject-Sequence", "1",
		"Nats-Expected-Last-Subject-Sequence-Subject", events.SubjectRun(run))); !strings.Contains(d, fmt.Sprint(result.Sequence)) {
		t.Fatalf("control: the stream's answer %q does not give alice's run's last sequence %d", d, result.Sequence)
	}
	if a := send(t, ctx, core, "toolbus.core-probe.run.cancel.z", `{}`, "Nats-Msg-Id", secret); !a.Duplicate {
		t.Fatalf("control: the stream does not answer alice's result's id as a duplicate: %+v", a)
	}

	leaks := func(what string, a answer) {
		t.Helper()
		if d := desc(a); strings.Contains(d, "call-secret") || strings.Contains(d, "wrong last") || a.Duplicate || a.Seq == result.Sequence {
			t.Errorf("%s: the answer tells of alice's run: %+v %q", what, a, d)
		}
	}
	refused := func(what string, nc *nats.Conn, subject string, h ...string) {
		t.Helper()
		a := send(t, ctx, nc, subject, `{}`, h...)
		leaks(what, a)
		if a.Error == nil || a.Error.Code != 400 || a.Error.ErrCode != events.WriteRefusedErrCode || !strings.HasPrefix(a.Error.Desc, "toolbus intake: ") {
			t.Errorf("%s: not refused by the write service: %+v", what, a)
		}
		if stored(subject) {
			t.Errorf("%s: stored", what)
		}
	}
	cancel := func(r string) string { return events.SubjectRunCancel(r, "bob") }
	refused("Nats-Expected-Last-Msg-Id", bob, cancel("bob-one"), event(events.IDRunCancel("bob-one"), "Nats-Expected-Last-Msg-Id", "x")...)
	refused("a sequence over alice's run", bob, events.SubjectRunStarted(run, "bob"), event(events.IDRunStarted(run),
		"Nats-Expected-Last-Subject-Sequence", "1", "Nats-Expected-Last-Subject-Sequence-Subject", events.SubjectRun(run))...)
	refused("a condition over every run", bob, events.SubjectRunStarted("bob-two", "bob"), event(events.IDRunStarted("bob-two"),
		"Nats-Expected-Last-Subject-Sequence", "0", "Nats-Expected-Last-Subject-Sequence-Subject", "toolbus.>")...)
	refused("a condition on a cancel", bob, cancel(run), event(events.IDRunCancel(run),
		"Nats-Expected-Last-Subject-Sequence", "0", "Nats-Expected-Last-Subject-Sequence-Subject", events.SubjectRun(run))...)
	refused("another run's message id", bob, cancel("bob-three"), event(secret, "Nats-Msg-Id", secret)...)
	refused("a message id that is not the event's", bob, cancel("bob-four"), event(events.IDRunCancel("bob-four"), "Nats-Msg-Id", "bob-four/x")...)
	for _, h := range [][]string{
		{"Nats-Expected-Last-Sequence", "1"}, {"Nats-Expected-Stream", events.DefaultStream}, {"Nats-TTL", "1s"},
		{"Nats-Batch-Id", "b"}, {"Nats-Schedule", "@every 1s"}, {"Nats-Rollup", "sub"}, {"KV-Operation", "PURGE"}, {"X-Anything", "1"},
		{"nats-expected-last-msg-id", "x"},
	} {
		refused(h[0], bob, cancel("bob-five"), event(events.IDRunCancel("bob-five"), h...)...)
		refused(h[0]+" by a team", beta, events.SubjectToolLog("beta-one", "search"), h...)
	}
	refused("a message id on a key", beta, "$KV."+store.BucketClaims+".search.beta-one.0.c1", "Nats-Msg-Id", "beta-one/x")

	// Admitted as bob's own data: his cancel of alice's run under her result's id is no
	// duplicate of hers (the id is stored as bob's), and the same cancel again is one of
	// his own (his re-publish is still deduplicated). That is the control of the headers
	// refused above: the same write with toolbus's own headers is stored.
	own := send(t, ctx, bob, cancel(run), `{}`, event(secret, "Nats-Msg-Id", secret)...)
	leaks("alice's result's id on bob's cancel of her run", own)
	if own.Error != nil || own.Seq == 0 {
		t.Errorf("bob's cancel with toolbus's headers: %+v", own.Error)
	}
	if again := send(t, ctx, bob, cancel(run), `{}`, event(secret, "Nats-Msg-Id", secret)...); !again.Duplicate || again.Seq != own.Seq {
		t.Errorf("bob's cancel sent again: %+v, want a duplicate of his own at %d", again, own.Seq)
	}
	if got, err := stream.GetMsg(ctx, own.Seq); err != nil || got.Header.Get("Nats-Msg-Id") != secret+"/tenant/client.bob" {
		t.Errorf("bob's cancel is stored under %v (%v), want his own id", got, err)
	}

	// The conditions toolbus's own flows rely on get a conflict (the stream's code),
	// in the service's words: bob's start of alice's run id (the id is taken: that much a
	// caller-chosen id tells), a team's key created twice, a stale revision.
	taken := send(t, ctx, bob, events.SubjectRunStarted(run, "bob"), `{}`, event(events.IDRunStarted(run), "Nats-Msg-Id", events.IDRunStarted(run),
		"Nats-Expected-Last-Subject-Sequence", "0", "Nats-Expected-Last-Subject-Sequence-Subject", events.SubjectRun(run))...)
	leaks("bob's start of alice's run id", taken)
	if taken.Error == nil || taken.Error.ErrCode != events.WriteConflictErrCode || !strings.Contains(taken.Error.Desc, "conflict") {
		t.Errorf("bob's start of alice's run id: %+v, want a conflict", taken.Error)
	}
	key := "$KV." + store.BucketClaims + ".search.beta-one.0.c1"
	first := send(t, ctx, beta, key, `{}`, "Nats-Expected-Last-Subject-Sequence", "0")
	if first.Error != nil {
		t.Fatalf("beta creates its claim: %+v", first.Error)
	}
	for what, rev := range map[string]string{"created again": "0", "a stale revision": fmt.Sprint(first.Seq - 1)} {
		a := send(t, ctx, beta, key, `{}`, "Nats-Expected-Last-Subject-Sequence", rev)
		if a.Error == nil || a.Error.ErrCode != events.WriteConflictErrCode || strings.ContainsAny(a.Error.Desc, "0123456789") {
			t.Errorf("beta's claim %s: %+v, want a conflict naming no sequence", what, a.Error)
		}
	}
	if a := send(t, ctx, beta, key, `{}`, "Nats-Expected-Last-Subject-Sequence", fmt.Sprint(first.Seq)); a.Error != nil {
		t.Errorf("beta's claim at its revision: %+v", a.Error)
	}
	if a := send(t, ctx, beta, key, ``, "KV-Operation", "DEL"); a.Error != nil {
		t.Errorf("beta deletes its claim: %+v", a.Error)
	}
}

// TestConflictsReachTheClients: the Go clients' flows that rely on a conflict work
// through the write service: a team's key created twice is jetstream.ErrKeyExists (the
// claims' and secrets' compare-and-set), and a client's start of a run id another
// identity holds is events.ErrRunExists, as is the owner's own second start.
func TestConflictsReachTheClients(t *testing.T) {
	srv := intaketest.StartTenants(t, map[string][]string{"beta": {"search"}}, map[string][]string{"alice": {"alice"}, "bob": {"bob"}})
	ctx := eventstest.Context(t, time.Minute)
	core := eventstest.Connect(t, srv, "core")
	coreBus, _, err := provision.Setup(ctx, core, events.Config{}, provision.WithTools([]string{"search"}, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = reads.New(coreBus, nil).Serve(rctx) }()

	beta := eventstest.Connect(t, srv, "beta")
	bjs, err := jetstream.NewWithAPIPrefix(beta, eventstest.TeamAPIPrefix)
	if err != nil {
		t.Fatal(err)
	}
	kv := store.NewDirectKV(bjs, beta, eventstest.TeamAPIPrefix, store.BucketClaims)
	if _, err := kv.Create(ctx, "search.r1.0.c1", []byte(`{}`)); err != nil {
		t.Fatalf("beta creates its claim: %v", err)
	}
	if _, err := kv.Create(ctx, "search.r1.0.c1", []byte(`{}`)); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Errorf("beta creates its claim again: %v, want jetstream.ErrKeyExists", err)
	}

	client := func(id string) *events.Bus {
		var bus *events.Bus
		eventstest.Eventually(t, 30*time.Second, func() error {
			var err error
			bus, err = events.Open(ctx, eventstest.Connect(t, srv, id), events.Config{ReadPrefix: events.ReadAPIPrefix(id)})
			return err
		})
		return bus
	}
	start := func(bus *events.Bus, id string) error {
		return bus.StartRun(ctx, "test", toolbus.RunStarted{RunID: "alice-slow", Principal: toolbus.Principal{ID: id},
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "hi"}}})
	}
	alice, bob := client("alice"), client("bob")
	if err := start(alice, "alice"); err != nil {
		t.Fatalf("alice's start: %v", err)
	}
	for who, bus := range map[string]*events.Bus{"alice": alice, "bob": bob} {
		if err := start(bus, who); !errors.Is(err, events.ErrRunExists) {
			t.Errorf("%s's start of alice-slow: %v, want events.ErrRunExists", who, err)
		}
	}
	if _, err := bob.RunStarted(ctx, "alice-slow"); err == nil {
		t.Error("bob reads alice's run")
	}
}

// TestTenantQuotaCountsSubjects: a write costs its subject, headers and
// intake.MessageOverhead besides its data, so empty writes on long subjects are not
// free: team alpha's flood of empty logs on run ids of 128 characters (the longest a run
// id may be) is refused over quota within its burst and rate. Tokens past their bounds
// are refused before anything is stored (a run token of 3,000 characters, a claim key
// with a call token of 3 KB or a token too many), while the same writes within the
// bounds (the controls) are stored.
func TestTenantQuotaCountsSubjects(t *testing.T) {
	lim := intake.Limits{BytesPerSecond: 1000, Burst: 32 << 10}
	srv := intaketest.StartTenantsLimited(t, map[string][]string{"alpha": {"calc"}, "beta": {"search"}}, nil, lim)
	ctx := eventstest.Context(t, time.Minute)
	core := provisionedCore(t, ctx, srv)
	js, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	stored := func(stream, subject string) bool {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.GetLastMsgForSubject(ctx, subject)
		return err == nil
	}
	alpha, beta := eventstest.Connect(t, srv, "alpha"), eventstest.Connect(t, srv, "beta")

	for _, tc := range []struct {
		what, subject, stream string
		refused               bool
		core                  bool // sent by the core on the write service's subject: beta's account does not import it
	}{
		{"a run id of 128 characters", events.SubjectToolLog(strings.Repeat("r", 128), "search"), events.DefaultStream, false, false},
		{"a run token of 3,000 characters", events.SubjectToolLog(strings.Repeat("r", 3000), "search"), events.DefaultStream, true, false},
		{"a claim key", "$KV." + store.BucketClaims + ".search.r1.0.c1", "KV_" + store.BucketClaims, false, false},
		{"a claim key with a call token of 3 KB", "$KV." + store.BucketClaims + ".search.r1.0." + strings.Repeat("c", 3000), "KV_" + store.BucketClaims, true, false},
		{"a claim key with a token too many", "$KV." + store.BucketClaims + ".search.r1.0.c1.x", "KV_" + store.BucketClaims, true, false},
		{"an output chunk", "$KV." + store.BucketOutputs + ".search.r1.0.c1.0", "KV_" + store.BucketOutputs, false, false},
		{"an output key with a run token of 3,000 characters", "$KV." + store.BucketOutputs + ".search." + strings.Repeat("r", 3000) + ".0.c1.0", "KV_" + store.BucketOutputs, true, false},
		{"another team's instance record", "$KV." + store.BucketInstances + ".alpha.i1.b1", "KV_" + store.BucketInstances, true, true},
	} {
		nc, subject := beta, tc.subject
		if tc.core {
			nc, subject = core, events.TeamWriteSubject("beta", tc.subject)
		}
		a := write(t, ctx, nc, subject, "", "")
		if refused := a.Error != nil; refused != tc.refused || refused && a.Error.ErrCode != events.WriteRefusedErrCode {
			t.Errorf("beta writes %s: %+v, want refused %v", tc.what, a.Error, tc.refused)
		}
		if got := stored(tc.stream, tc.subject); got == tc.refused {
			t.Errorf("beta writes %s: stored %v, want %v", tc.what, got, !tc.refused)
		}
	}

	subject := events.SubjectToolLog(strings.Repeat("a", 128), "calc")
	cost := len(subject) + intake.MessageOverhead
	began, n := time.Now(), 0
	var quota *answer
	for range 4 * lim.Burst / cost {
		a := write(t, ctx, alpha, subject, "", "")
		if a.Error != nil {
			quota = &a
			break
		}
		n++
	}
	if quota == nil || quota.Error.Code != 429 || quota.Error.ErrCode != events.WriteQuotaErrCode {
		t.Fatalf("alpha's %d empty writes on a subject of %d bytes are not refused over quota: %+v", n, len(subject), quota)
	}
	if most := (float64(lim.Burst) + lim.BytesPerSecond*time.Since(began).Seconds()) / float64(cost); float64(n) > most+1 {
		t.Errorf("alpha got %d empty writes of %d bytes each stored, over its burst and rate (%.0f)", n, cost, most)
	}
	if a := write(t, ctx, beta, events.SubjectToolLog("r2", "search"), "", ""); a.Error != nil {
		t.Errorf("beta's write beside alpha's flood: %+v", a.Error)
	}
}
