package admin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// The upgrade past issue 54 narrows the core's acknowledgement exports and every team's
// ack imports; toolbus admin push sends the tenants' JWTs before the core's, so a
// team's imports stay valid at every step of the push and its running executors' acks
// keep working. On a live deployment (full resolver) brought back to the JWTs of the
// version before (its wide ack subjects, re-signed with the deployment's keys): after
// each account of accountsToPush's order is pushed, every import alpha holds of the core
// is valid; the control, the core pushed first, leaves alpha's old ack imports invalid.
// Going back to the wider JWTs in the same order works too (alpha's imports the core
// does not export yet are re-applied by the core's push).
func TestPushKeepsTenantsImports(t *testing.T) {
	ctx := eventstest.Context(t, time.Minute)
	l := newLiveAdmin(t, ctx)
	l.adm("", "init")
	l.adm("", "add-team", "alpha", "calc")
	srv, _ := l.serve(provision.WithTools([]string{"calc"}, 30*time.Second, 10))
	l.must("executor-alpha.creds") // the server loads alpha's account
	d, err := open(l.dir)
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.issue(d.grants)
	if err != nil {
		t.Fatal(err)
	}
	alphaPub := res.TeamAccounts["alpha"]
	sys, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(res.SystemCreds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	push := func(pub, claims string) {
		t.Helper()
		if err := natsjwt.PushAccounts(ctx, sys, map[string]string{pub: claims}); err != nil {
			t.Fatal(err)
		}
	}
	old := wideAcks(t, l.dir, res)
	want := 0
	for _, c := range accounts.TeamExports("alpha", []string{"calc"}) {
		if !c.Stream {
			want++
		}
	}
	// imports says what is wrong with alpha's service imports of the core: one invalid,
	// or fewer than its crossings.
	imports := func() []string {
		info, err := srv.Accountz(&server.AccountzOptions{Account: alphaPub})
		if err != nil {
			t.Fatal(err)
		}
		var bad []string
		n := 0
		for _, im := range info.Account.Imports {
			if im.Account != res.Account || im.Type != jwt.Service {
				continue
			}
			n++
			if im.Invalid {
				bad = append(bad, "invalid "+string(im.Subject))
			}
		}
		if n != want {
			bad = append(bad, fmt.Sprintf("%d imports of the core, want %d", n, want))
		}
		return bad
	}
	order := accountsToPush(res, true)
	if len(order) != 2 || accountKey(res, order[1]) != res.Account {
		t.Fatalf("push order %v: want the team's account, then the core's", order)
	}
	back := func() { // to the version before, in the same order
		t.Helper()
		push(alphaPub, old[alphaPub])
		push(res.Account, old[res.Account])
		if bad := imports(); len(bad) > 0 {
			t.Fatalf("after going back to the wide acks: %v", bad)
		}
	}
	back()
	for _, name := range order {
		pub := accountKey(res, name)
		push(pub, res.AccountJWTs[pub])
		if bad := imports(); len(bad) > 0 {
			t.Errorf("after pushing %s: alpha's imports %v", name, bad)
		}
	}
	v1, _ := accounts.AckSubjects("TOOLBUS_QUEUES", "tool_calc")
	if info, _ := srv.Accountz(&server.AccountzOptions{Account: alphaPub}); !strings.Contains(strings.Join(importSubjects(info), " "), v1) {
		t.Errorf("alpha does not import %s after the push", v1)
	}
	// The control: the core first.
	back()
	push(res.Account, res.AccountJWTs[res.Account])
	if bad := imports(); !strings.Contains(strings.Join(bad, " "), "invalid $JS.ACK.") {
		t.Errorf("the core pushed first left alpha's old ack imports valid: %v", bad)
	}
}

func importSubjects(info *server.Accountz) []string {
	var out []string
	for _, im := range info.Account.Imports {
		out = append(out, string(im.Subject))
	}
	return out
}

// wideAcks are the JWTs of res's core and alpha's accounts as the version before issue
// 54 issued them: ack exports and imports ending in ".>", the activations signed anew by
// the core's key and the accounts by the operator's (the deployment's seeds in dir).
func wideAcks(t *testing.T, dir string, res natsjwt.Result) map[string]string {
	t.Helper()
	seed := func(f string) nkeys.KeyPair {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	okp, ckp := seed("operator.nk"), seed("account.nk")
	wide := func(s jwt.Subject) jwt.Subject {
		str := string(s)
		if !strings.HasPrefix(str, "$JS.ACK.") {
			return s
		}
		toks := strings.Split(str, ".")
		n := 4 // $JS.ACK.<stream>.<consumer>
		if toks[2] == "*" {
			n = 6
		}
		return jwt.Subject(strings.Join(toks[:n], ".") + ".>")
	}
	out := map[string]string{}
	core, err := jwt.DecodeAccountClaims(res.AccountJWTs[res.Account])
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range core.Exports {
		e.Subject = wide(e.Subject)
	}
	alphaPub := res.TeamAccounts["alpha"]
	alpha, err := jwt.DecodeAccountClaims(res.AccountJWTs[alphaPub])
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range alpha.Imports {
		if w := wide(im.Subject); w != im.Subject {
			act := jwt.NewActivationClaims(alphaPub)
			act.Name, act.ImportSubject, act.ImportType = string(w), w, jwt.Service
			if im.Token, err = act.Encode(ckp); err != nil {
				t.Fatal(err)
			}
			im.Subject, im.Name = w, string(w)
		}
	}
	for pub, c := range map[string]*jwt.AccountClaims{res.Account: core, alphaPub: alpha} {
		if out[pub], err = c.Encode(okp); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
