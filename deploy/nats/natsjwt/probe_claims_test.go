package natsjwt_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/reads"
)

// claimsProbes: a team reaches of the shared claims bucket only its own tools' keys, by
// every route its account has (direct gets, prefixed and not, with bodies naming other
// keys; the core's read service, which serves them where the bucket serves no direct
// gets; writes, deletes and purges through the write service). With the read service
// running, beta stores its claim through its own import and reads it back both ways
// (the owner's control), and alpha does the same with its own claim (alpha's control:
// its routes work); every probe of alpha's on beta's claim answers nothing of it (no
// responders, or its own account's error) and leaves it as beta wrote it, with no key
// of alpha's under beta's tool.
func claimsProbes(t *testing.T, ctx context.Context, d *accountsDeployment, alpha, beta *nats.Conn) {
	t.Helper()
	bus, _, err := provision.Setup(ctx, d.conn("admin"), events.Config{}, provision.WithTools([]string{"calc", "search"}, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- reads.New(bus, nil).Serve(rctx) }()
	defer func() { stop(); <-served }()
	eventstest.Eventually(t, 30*time.Second, func() error {
		if !slices.ContainsFunc(eventstest.Subscriptions(t, d.srv, coreName(d)), func(s string) bool { return strings.HasPrefix(s, events.TeamReadPrefix+".") }) {
			return errors.New("the read service does not listen yet")
		}
		return nil
	})
	const bucket = "toolbus_claims"
	key := func(tool, call string) string { return "$KV." + bucket + "." + tool + ".rc.0." + call }
	betaKey, ownKey := key("search", "c1"), key("calc", "c1")
	direct := func(subject string) string { return natsjwt.CoreAPIPrefix + ".DIRECT.GET.KV_" + bucket + "." + subject }
	teamRead := func(subject string) string { return events.TeamReadLocal("KV_"+bucket, subject) }
	// The controls: each team writes its claim through its import and reads it back.
	for _, c := range []struct {
		nc        *nats.Conn
		who, subj string
		mark      string
	}{{beta, "beta", betaKey, secretMark}, {alpha, "alpha", ownKey, ownMark}} {
		if a, err := c.nc.Request(c.subj, []byte(`{"instance":"`+c.mark+`"}`), 5*time.Second); err != nil || !strings.Contains(string(a.Data), `"seq"`) {
			t.Fatalf("control: %s writes its claim %s: %v %q", c.who, c.subj, err, dataOf(a))
		}
		for _, s := range []string{direct(c.subj), teamRead(c.subj)} {
			if got := askWithin(t, c.nc, s, "", 5*time.Second); !carries(got, c.mark) {
				t.Errorf("control: %s reads its claim on %s: %s", c.who, s, show(got))
			}
		}
	}
	for _, p := range [][2]string{
		{direct(betaKey), ""},
		{"$JS.API.DIRECT.GET.KV_" + bucket + "." + betaKey, ""},
		{natsjwt.CoreAPIPrefix + ".DIRECT.GET.KV_" + bucket, `{"last_by_subj":"` + betaKey + `"}`},
		{direct(ownKey), `{"last_by_subj":"` + betaKey + `"}`},
		{direct(ownKey), `{"seq":1}`},
		{direct(ownKey), `{"seq":1,"next_by_subj":"$KV.toolbus_claims.>"}`},
		{direct("$KV." + bucket + ".calc.>"), `{"multi_last":["$KV.toolbus_claims.>"]}`},
		{teamRead(betaKey), ""},
		{teamRead("$KV." + bucket + ".>"), ""},
		{events.TeamReadSubject("beta", "KV_"+bucket, betaKey), ""},
		{events.TeamReadSubject("alpha", "KV_"+bucket, betaKey), ""},
		{natsjwt.CoreAPIPrefix + ".STREAM.MSG.GET.KV_" + bucket, `{"last_by_subj":"` + betaKey + `"}`},
	} {
		got := askWithin(t, alpha, p[0], p[1], time.Second)
		// Refused: no answer, a status with no data (the server's 408 for a body on a
		// direct get in subject form), or its own account's error.
		if carries(got, secretMark) || len(got) > 0 && len(got[0].Data) > 0 && !strings.Contains(string(got[0].Data), `"error"`) && !carries(got, ownMark) {
			t.Errorf("HOLE: alpha's read %s %s of beta's claim: %s", p[0], p[1], show(got))
		}
	}
	for _, w := range []struct {
		subject string
		header  nats.Header
	}{
		{betaKey, nil},
		{key("search", "c9"), nil},
		{betaKey, nats.Header{"KV-Operation": {"DEL"}}},
		{betaKey, nats.Header{"KV-Operation": {"PURGE"}, "Nats-Rollup": {"sub"}}},
		{"$KV." + bucket + ".search.>", nil},
	} {
		m := &nats.Msg{Subject: w.subject, Header: w.header, Data: []byte(`{"instance":"` + probeMark + `"}`)}
		if a, err := alpha.RequestMsg(m, time.Second); err == nil && strings.Contains(string(a.Data), `"seq"`) {
			t.Errorf("HOLE: alpha's write %s %v was stored: %q", w.subject, w.header, a.Data)
		}
	}
	if d.exists("KV_"+bucket, key("search", "c9")) {
		t.Errorf("HOLE: alpha stored %s under beta's tool", key("search", "c9"))
	}
	// Beta's claim is the last message on its key, as beta wrote it (a delete or purge
	// of alpha's would be a marker after it).
	if got := askWithin(t, beta, direct(betaKey), "", 5*time.Second); !carries(got, secretMark) {
		t.Errorf("HOLE: beta's claim after alpha's probes: %s", show(got))
	}
}
