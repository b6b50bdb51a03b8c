package natsjwt_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// credKind is one kind of generated credentials: its server config and how a user of it
// connects.
type credKind struct {
	name string
	conf func(natsjwt.Result) string
	auth func(t *testing.T, res natsjwt.Result, user string) nats.Option
}

var credKinds = []credKind{
	{"jwt", func(r natsjwt.Result) string { return r.Config }, func(_ *testing.T, r natsjwt.Result, u string) nats.Option {
		if u == natsjwt.SystemUser {
			return nats.UserCredentials(r.SystemCreds)
		}
		return nats.UserCredentials(r.Creds[u])
	}},
	{"users", func(r natsjwt.Result) string { return r.UsersConfig }, func(t *testing.T, r natsjwt.Result, u string) nats.Option {
		pw, err := os.ReadFile(r.Passwords[u])
		if err != nil {
			t.Fatal(err)
		}
		return nats.UserInfo(u, string(pw))
	}},
	{"nkeys", func(r natsjwt.Result) string { return r.NkeysConfig }, func(t *testing.T, r natsjwt.Result, u string) nats.Option {
		o, err := nats.NkeyOptionFromSeed(r.Seeds[u])
		if err != nil {
			t.Fatal(err)
		}
		return o
	}},
}

// accountsDeployment is a server started from one kind of a generated accounts layout,
// set up by the core admin (the stream, the buckets, the tools' queues).
type accountsDeployment struct {
	t    *testing.T
	ctx  context.Context
	srv  *server.Server
	opts *server.Options
	res  natsjwt.Result
	kind credKind
	core jetstream.JetStream
}

func startAccounts(t *testing.T, ctx context.Context, kind credKind, res natsjwt.Result, tools ...string) *accountsDeployment {
	t.Helper()
	opts, err := server.ProcessConfigFile(kind.conf(res))
	if err != nil {
		t.Fatal(err)
	}
	d := &accountsDeployment{t: t, ctx: ctx, srv: eventstest.StartServer(t, opts), opts: opts, res: res, kind: kind}
	admin := d.conn("admin")
	if _, _, err := provision.Setup(ctx, admin, events.Config{}, provision.WithTools(tools, 0, 0)); err != nil {
		t.Fatalf("the core admin sets up: %v", err)
	}
	if d.core, err = jetstream.New(admin); err != nil {
		t.Fatal(err)
	}
	// The injector's write service, with the generated injector credentials: tenants'
	// writes reach the core's streams only through it.
	intaketest.ServeIntake(t, d.conn("injector"), intake.Limits{})
	return d
}

func (d *accountsDeployment) conn(user string) *nats.Conn {
	d.t.Helper()
	nc, err := nats.Connect(d.srv.ClientURL(), d.kind.auth(d.t, d.res, user), nats.Timeout(5*time.Second))
	if err != nil {
		d.t.Fatalf("%s connects: %v", user, err)
	}
	d.t.Cleanup(nc.Close)
	return nc
}

// team connects a team's executor as its executors will: JetStream under the core's
// API prefix its generated settings name.
func (d *accountsDeployment) team(team string) (*nats.Conn, jetstream.JetStream) {
	d.t.Helper()
	want := "TOOLBUS_NATS_API_PREFIX=" + natsjwt.CoreAPIPrefix
	if env := d.res.Env[natsjwt.TeamUser(team)]; !strings.Contains(strings.Join(env, " "), want) {
		d.t.Fatalf("the settings of %s's executors lack %s: %v", team, want, env)
	}
	nc := d.conn(natsjwt.TeamUser(team))
	js, err := jetstream.NewWithAPIPrefix(nc, natsjwt.CoreAPIPrefix)
	if err != nil {
		d.t.Fatal(err)
	}
	return nc, js
}

// request publishes a core event or key as the admin.
func (d *accountsDeployment) put(subject, data string) {
	d.t.Helper()
	if _, err := d.core.Publish(d.ctx, subject, []byte(data)); err != nil {
		d.t.Fatalf("core puts %s: %v", subject, err)
	}
}

// stored reports whether the core holds, as the last message on subject in stream, one
// that a probe of alpha's wrote (its data contains probeMark).
func (d *accountsDeployment) stored(stream, subject string) bool {
	d.t.Helper()
	s, err := d.core.Stream(d.ctx, stream)
	if err != nil {
		d.t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(d.ctx, subject)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		d.t.Fatal(err)
	}
	return err == nil && strings.Contains(string(m.Data), probeMark)
}

// probeMark marks what alpha's probes write, and the calls the reply-subject attack
// would store.
const probeMark = "alpha-probe"

// serve does a team's whole round on its tool across the boundary: binds its queue,
// takes the call of run, answers it with an acknowledgement from the stream, acks the
// call, puts and reads back a claim, its instance record and its catalog entry.
func (d *accountsDeployment) serve(team, tool, run string) {
	t := d.t
	t.Helper()
	nc, js := d.team(team)
	call, err := pullCall(nc, tool, 5*time.Second)
	if err != nil || events.CallSubject(call.Subject, call.Header) != events.SubjectToolRequested(run, tool) {
		t.Fatalf("%s's pull of %s: %v %v", team, tool, call, err)
	}
	if ack, err := js.Publish(d.ctx, events.SubjectToolFinished(run, tool), []byte(`{"team":"`+team+`"}`)); err != nil || ack.Stream != events.DefaultStream {
		t.Fatalf("%s's result: %v %v", team, ack, err)
	}
	if _, err := nc.Request(call.Reply, []byte("+ACK"), 5*time.Second); err != nil {
		t.Fatalf("%s acknowledges its call: %v", team, err)
	}
	for _, kv := range []struct{ bucket, key string }{
		{"toolbus_claims", tool + "." + run + ".0.c1"},
		{"toolbus_instances", team + ".i1.b1"},
		{"toolbus_tools", tool},
		{"toolbus_outputs", tool + "." + run + ".0.c1.0"},
	} {
		subj := "$KV." + kv.bucket + "." + kv.key
		if ack, err := js.Publish(d.ctx, subj, []byte(team+" "+kv.key)); err != nil || ack.Stream != "KV_"+kv.bucket {
			t.Fatalf("%s puts %s: %v %v", team, subj, ack, err)
		}
		if kv.bucket == "toolbus_outputs" {
			continue // written by executors, read by the core
		}
		m, err := nc.RequestWithContext(d.ctx, natsjwt.CoreAPIPrefix+".DIRECT.GET.KV_"+kv.bucket+"."+subj, nil)
		if err != nil || string(m.Data) != team+" "+kv.key {
			t.Fatalf("%s direct-gets %s: %v %q", team, subj, err, dataOf(m))
		}
	}
}

func dataOf(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}

// The accounts layout, in each kind of credentials, on the real server: each team's
// executor, in its own account, serves its tool through the core's exports (pull, ack,
// result, claims, instance record, catalog entry), and no route reaches another team's
// or the core's data: another queue, the stream's direct gets and infos, another tool's
// or team's keys, the runs, history and approvals buckets, a consumer create, a pull
// whose reply subject is a core stream's subject, a subscription to everything; of the
// shared claims bucket, only its own tools' keys by every route (claimsProbes).
func TestAccountsLayoutBoundary(t *testing.T) {
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}, "beta": {"search"}}}
	res := generateAccounts(t, g)
	for _, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := eventstest.Context(t, time.Minute)
			d := startAccounts(t, ctx, kind, res, "calc", "search")
			alphaNC, _ := d.team("alpha")
			heard, err := alphaNC.SubscribeSync(">")
			if err != nil {
				t.Fatal(err)
			}
			if err := alphaNC.Flush(); err != nil {
				t.Fatal(err)
			}
			// Beta's service follows its own tool's results (the control of alpha's >).
			betaNC, _ := d.team("beta")
			betaHeard, err := betaNC.SubscribeSync(events.SubjectToolFinished("*", "search"))
			if err != nil {
				t.Fatal(err)
			}
			if err := betaNC.Flush(); err != nil {
				t.Fatal(err)
			}
			for _, run := range []string{"r1", "r2"} {
				d.put(events.SubjectToolRequested(run, "calc"), `{"secret":"alpha args `+run+`","mark":"`+probeMark+`"}`)
				d.put(events.SubjectToolRequested(run, "search"), `{"secret":"beta args `+run+`"}`)
			}
			// Results and progress the core stores for both tools of a run (a timed-out
			// call's result is the core's): each team hears its own tool's.
			d.put(events.SubjectToolFinished("r2", "calc"), `{"by":"the core, of alpha's call"}`)
			d.put(events.SubjectToolProgress("r2", "calc"), `{"by":"the core, of alpha's call"}`)
			d.put(events.SubjectToolFinished("r2", "search"), `{"secret":"beta result r2"}`)
			d.put(events.SubjectToolProgress("r2", "search"), `{"secret":"beta progress r2"}`)
			d.put(events.SubjectRunEnded("r1", "completed"), `{"secret":"core"}`)
			for _, kv := range []string{"$KV.toolbus_runs.r1", "$KV.toolbus_history.r1", "$KV.toolbus_approvals.r1.c1"} {
				d.put(kv, `{"secret":"core"}`)
			}
			d.serve("alpha", "calc", "r1")
			d.serve("beta", "search", "r1")
			// The doorbell and the cancels of its own tool reach alpha (stream exports);
			// beta's do not.
			for _, subj := range []string{events.SubjectRunEndedFor("r1", "search"), events.SubjectRunEndedFor("r1", "calc")} {
				if err := d.core.Conn().Publish(subj, []byte(`{"cancel":"`+subj+`"}`)); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.core.Conn().Flush(); err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for {
				m, err := heard.NextMsg(500 * time.Millisecond)
				if err != nil {
					break
				}
				got[m.Subject] = true
				if strings.Contains(m.Subject, "search") || strings.Contains(string(m.Data), "beta") || strings.Contains(string(m.Data), `"core"`) {
					t.Errorf("alpha, subscribed to >, heard %s: %s", m.Subject, m.Data)
				}
			}
			for _, want := range []string{events.SubjectToolRequested("r2", "calc"), events.SubjectRunEndedFor("r1", "calc"),
				events.SubjectToolFinished("r2", "calc"), events.SubjectToolProgress("r2", "calc")} {
				if !got[want] {
					t.Errorf("alpha did not hear %s (the stream exports of its tool); heard %v", want, got)
				}
			}
			betaGot := map[string]bool{}
			for {
				m, err := betaHeard.NextMsg(500 * time.Millisecond)
				if err != nil {
					break
				}
				betaGot[m.Subject] = true
			}
			if !betaGot[events.SubjectToolFinished("r2", "search")] {
				t.Errorf("control: beta did not hear the core's result of its own tool; heard %v", betaGot)
			}
			// Alpha's own probes below would be heard (they are its account's traffic)
			// and would wait for the subscription to answer.
			if err := heard.Unsubscribe(); err != nil {
				t.Fatal(err)
			}
			probeClosed(t, d, alphaNC)
			claimsProbes(t, ctx, d, alphaNC, betaNC)
		})
	}
}

// probeClosed tries, with alpha's connection, every route to beta's or the core's data
// and checks that none answers and nothing is stored.
func probeClosed(t *testing.T, d *accountsDeployment, alpha *nats.Conn) {
	t.Helper()
	api := natsjwt.CoreAPIPrefix
	for _, p := range []struct {
		name, subject, body string
		// stored: where a write would land (stream, subject) if it got through.
		stream, stored string
	}{
		{name: "beta's queue", subject: api + ".CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.tool_search", body: `{"batch":1}`},
		{name: "beta's queue, unprefixed", subject: "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.tool_search", body: `{"batch":1}`},
		{name: "beta's queue info", subject: api + ".CONSUMER.INFO.TOOLBUS_QUEUES.tool_search"},
		{name: "direct get on TOOLBUS", subject: api + ".DIRECT.GET.TOOLBUS", body: `{"seq":1}`},
		{name: "direct get on TOOLBUS by subject", subject: api + ".DIRECT.GET.TOOLBUS.toolbus.r1.tool.requested.search"},
		{name: "direct get on TOOLBUS, unprefixed", subject: "$JS.API.DIRECT.GET.TOOLBUS", body: `{"seq":1}`},
		{name: "message get on TOOLBUS", subject: api + ".STREAM.MSG.GET.TOOLBUS", body: `{"seq":1}`},
		{name: "stream info", subject: api + ".STREAM.INFO.TOOLBUS"},
		{name: "stream info of the claims", subject: api + ".STREAM.INFO.KV_toolbus_claims"},
		{name: "stream info, unprefixed", subject: "$JS.API.STREAM.INFO.TOOLBUS"},
		{name: "stream list", subject: api + ".STREAM.LIST"},
		{name: "another tool's claim", subject: api + ".DIRECT.GET.KV_toolbus_claims.$KV.toolbus_claims.search.r1.0.c1"},
		{name: "another tool's catalog entry", subject: api + ".DIRECT.GET.KV_toolbus_tools.$KV.toolbus_tools.search"},
		{name: "another team's instance", subject: api + ".DIRECT.GET.KV_toolbus_instances.$KV.toolbus_instances.beta.i1.b1"},
		{name: "another tool's output", subject: api + ".DIRECT.GET.KV_toolbus_outputs.$KV.toolbus_outputs.search.r1.out"},
		{name: "its own output, read", subject: api + ".DIRECT.GET.KV_toolbus_outputs.$KV.toolbus_outputs.calc.r1.out"},
		{name: "runs", subject: api + ".DIRECT.GET.KV_toolbus_runs.$KV.toolbus_runs.r1"},
		{name: "history", subject: api + ".DIRECT.GET.KV_toolbus_history.$KV.toolbus_history.r1"},
		{name: "approvals", subject: api + ".DIRECT.GET.KV_toolbus_approvals.$KV.toolbus_approvals.r1.c1"},
		{name: "consumer create", subject: api + ".CONSUMER.CREATE.TOOLBUS", body: `{"stream_name":"TOOLBUS","config":{"durable_name":"evil","ack_policy":"explicit"}}`},
		{name: "consumer create, unprefixed", subject: "$JS.API.CONSUMER.CREATE.TOOLBUS", body: `{"stream_name":"TOOLBUS","config":{"durable_name":"evil","ack_policy":"explicit"}}`},
		{name: "durable create", subject: api + ".CONSUMER.DURABLE.CREATE.TOOLBUS.evil", body: `{"stream_name":"TOOLBUS","config":{"durable_name":"evil","ack_policy":"explicit"}}`},
		{name: "write another tool's claim", subject: "$KV.toolbus_claims.search.r1.0.c9", stream: "KV_toolbus_claims", stored: "$KV.toolbus_claims.search.r1.0.c9"},
		{name: "write another team's instance", subject: "$KV.toolbus_instances.beta.x.y", stream: "KV_toolbus_instances", stored: "$KV.toolbus_instances.beta.x.y"},
		{name: "write another tool's catalog entry", subject: "$KV.toolbus_tools.search", stream: "KV_toolbus_tools", stored: "$KV.toolbus_tools.search"},
		{name: "write a run", subject: "$KV.toolbus_runs.r9", stream: "KV_toolbus_runs", stored: "$KV.toolbus_runs.r9"},
		{name: "another tool's result", subject: events.SubjectToolFinished("r2", "search"), stream: "TOOLBUS", stored: events.SubjectToolFinished("r2", "search")},
		{name: "a forged call", subject: events.SubjectToolRequested("r9", "calc"), stream: "TOOLBUS", stored: events.SubjectToolRequested("r9", "calc")},
		{name: "an outcome", subject: events.SubjectRunEnded("r9", "completed"), stream: "TOOLBUS", stored: events.SubjectRunEnded("r9", "completed")},
	} {
		d.reachesNothing(alpha, "alpha", p.name, p.subject, p.body, p.stream, p.stored)
	}
	d.noConsumerCreated("alpha")
	// The reply-subject attack: alpha pulls its own queue naming core subjects as the
	// reply. The server delivers in alpha's account (the call of r2, then the second
	// pull's expiry), and the core stores nothing.
	replies := []string{events.SubjectRunEnded("r2", "completed"), "$KV.toolbus_runs.r2"}
	for _, reply := range replies {
		sub, err := alpha.SubscribeSync(reply)
		if err != nil {
			t.Fatal(err)
		}
		if err := alpha.PublishRequest(api+".CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.tool_calc", reply, []byte(`{"batch":1,"expires":300000000}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("the pull with reply %s was not answered in alpha's account: %v", reply, err)
		}
	}
	if d.stored("TOOLBUS", replies[0]) || d.stored("KV_toolbus_runs", replies[1]) {
		t.Error("a pull of alpha's with a core subject as its reply stored a message in the core")
	}
	// The roll-up attack: alpha writes a key of its own asking the bucket to purge every
	// other key. The core's write service refuses it and beta's claim (marked, so that
	// stored finds it) stays; alpha's plain write of the same key (the control) is stored.
	betaClaim, own := "$KV.toolbus_claims.search.r1.0.c1", "$KV.toolbus_claims.calc.r1.0.c7"
	d.put(betaClaim, `{"beta":"claim","mark":"`+probeMark+`"}`)
	m := nats.NewMsg(own)
	m.Header.Set("Nats-Rollup", "all")
	if r, err := alpha.RequestMsgWithContext(d.ctx, m); err != nil || !strings.Contains(string(r.Data), `"err_code":10800`) {
		t.Errorf("alpha's roll-up of the claims bucket is not refused by the write service: %v %q", err, dataOf(r))
	}
	if !d.stored("KV_toolbus_claims", betaClaim) {
		t.Error("alpha's roll-up on its own claim key purged beta's claim")
	}
	if r, err := alpha.RequestWithContext(d.ctx, own, []byte(`{"mark":"`+probeMark+`"}`)); err != nil || !d.stored("KV_toolbus_claims", own) {
		t.Errorf("alpha's own claim key: %v %q", err, dataOf(r))
	}
}

// Day two in the accounts layout: regenerating with a third team, a new tool for alpha
// and a second client keeps every other account's and user's key, credentials and JWT
// byte for byte (the core account's too: its exports are token-required and do not name
// teams or identities), says what changed, and a reload of the running server (no
// restart) applies it: alpha's connection of day one pulls its new tool's queue, and the
// new team and the new client connect and work.
func TestAccountsDayTwo(t *testing.T) {
	perms := filepath.Join("..", "permissions.conf")
	day1 := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}, "beta": {"search"}},
		Clients: map[string][]string{"alice": {"alice"}}}
	day2 := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc", "calc2"}, "beta": {"search"}, "gamma": {"web"}},
		Clients: map[string][]string{"alice": {"alice"}, "bob": {"bob"}}}
	for _, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			dir := t.TempDir()
			gen := func(g natsjwt.Grants) natsjwt.Result {
				res, err := natsjwt.GenerateGrants(perms, dir, g, natsjwt.WithAccounts(), natsjwt.WithBcryptCost(bcrypt.MinCost))
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			res1 := gen(day1)
			before := readDir(t, dir)
			ctx := eventstest.Context(t, time.Minute)
			d := startAccounts(t, ctx, kind, res1, "calc", "calc2", "search", "web")
			alphaNC, _ := d.team("alpha")
			if _, err := pullCall(alphaNC, "calc2", time.Second); !errors.Is(err, nats.ErrNoResponders) {
				t.Fatalf("alpha pulls calc2's queue before it is granted: %v", err)
			}

			res2 := gen(day2)
			after := readDir(t, dir)
			// What a grant touches: the granted team's account, the new team's files, and
			// the server configs (which hold every account; the bcrypt hashes are salted
			// anew each run).
			touched := map[string]bool{"team-alpha.jwt": true, "auth-jwt.conf": true, "auth-users.conf": true,
				"auth-nkeys.conf": true, "k8s-secrets.yaml": true}
			for name, b := range before {
				if touched[name] {
					continue
				}
				if string(after[name]) != string(b) {
					t.Errorf("%s changed on day two", name)
				}
			}
			if string(after["team-alpha.jwt"]) == string(before["team-alpha.jwt"]) {
				t.Error("alpha's account JWT did not change with its new tool")
			}
			changes := map[string]string{}
			for _, c := range res2.Changes {
				changes[c.User] = c.What
			}
			for user, want := range map[string]string{"account TOOLBUS": "unchanged", "account team-alpha": "changed",
				"account team-beta": "unchanged", "account team-gamma": "new", natsjwt.TeamUser("gamma"): "new",
				natsjwt.TeamUser("alpha"): "unchanged", "admin": "unchanged",
				"account client-alice": "unchanged", "client-alice": "unchanged", "account client-bob": "new", "client-bob": "new"} {
				if changes[user] != want {
					t.Errorf("day two says %s: %q, want %q (all: %v)", user, changes[user], want, res2.Changes)
				}
			}

			// The running server takes day two on a reload (kill -HUP), not a restart. The
			// config kinds take two: nats-server 2.15.2 creates an account that a reload
			// adds without subscribing its service imports (configureAccounts: "only if
			// not reloading"); the next reload, finding it, does. The JWT kind's memory
			// resolver takes one (a reload stores the new preloads and updates every
			// account from them).
			reloads := 2
			if kind.name == "jwt" {
				reloads = 1
			}
			for range reloads {
				newOpts, err := server.ProcessConfigFile(kind.conf(res2))
				if err != nil {
					t.Fatal(err)
				}
				newOpts.Host, newOpts.Port, newOpts.HTTPHost, newOpts.HTTPPort = d.opts.Host, d.opts.Port, d.opts.HTTPHost, d.opts.HTTPPort
				newOpts.StoreDir, newOpts.NoLog, newOpts.NoSigs = d.opts.StoreDir, true, true
				if err := d.srv.ReloadOptions(newOpts); err != nil {
					t.Fatalf("reload: %v", err)
				}
			}
			d.res = res2
			d.put(events.SubjectToolRequested("r1", "calc2"), `{"n":1}`)
			eventstest.Eventually(t, 10*time.Second, func() error {
				m, err := pullCall(alphaNC, "calc2", 5*time.Second)
				if err != nil {
					return fmt.Errorf("alpha's day-one connection pulls no call of its new tool: %w", err)
				}
				return m.Ack()
			})
			if !alphaNC.IsConnected() {
				t.Error("alpha's connection is down")
			}
			d.put(events.SubjectToolRequested("r1", "web"), `{"n":1}`)
			d.serve("gamma", "web", "r1")
			// The new client starts a run as itself through its new account's imports.
			bob, err := jetstream.New(d.client("bob", "bob"))
			if err != nil {
				t.Fatal(err)
			}
			if ack, err := bob.Publish(ctx, events.SubjectRunStarted("r5", "bob"), []byte(`{}`)); err != nil || ack.Stream != events.DefaultStream {
				t.Fatalf("bob, added on day two, starts a run: %v %v", ack, err)
			}
		})
	}
}

func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// Operator mode without a reload: a tool granted to alpha is pushed to the running
// server (PushAccounts, with the generated system user) and alpha's connection, which
// could not bind the tool's queue, pulls it; the server neither restarts nor reloads.
func TestPushAccounts(t *testing.T) {
	dir := t.TempDir()
	perms := filepath.Join("..", "permissions.conf")
	gen := func(g natsjwt.Grants) natsjwt.Result {
		res, err := natsjwt.GenerateGrants(perms, dir, g, natsjwt.WithAccounts(), natsjwt.WithBcryptCost(bcrypt.MinCost))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res1 := gen(natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}}})
	ctx := eventstest.Context(t, time.Minute)
	d := startAccounts(t, ctx, credKinds[0], res1, "calc", "calc2")
	alpha, _ := d.team("alpha")
	if _, err := pullCall(alpha, "calc2", time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("alpha pulls calc2's queue before it is granted: %v", err)
	}
	res2 := gen(natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc", "calc2"}, "beta": {"search"}}})
	if res2.SystemCreds != res1.SystemCreds {
		t.Errorf("the system user's credentials moved: %s, then %s", res1.SystemCreds, res2.SystemCreds)
	}
	sys := d.conn(natsjwt.SystemUser)
	err := natsjwt.PushAccounts(ctx, sys, res2.AccountJWTs)
	// beta is new: no server has loaded its account yet (a reload does).
	if !errors.Is(err, natsjwt.ErrPushSkipped) || !strings.Contains(err.Error(), "team-beta") || strings.Contains(err.Error(), "team-alpha") {
		t.Fatalf("push: %v; want only team-beta skipped", err)
	}
	d.put(events.SubjectToolRequested("r1", "calc2"), `{"n":1}`)
	eventstest.Eventually(t, 10*time.Second, func() error {
		m, err := pullCall(alpha, "calc2", 5*time.Second)
		if err != nil {
			return fmt.Errorf("alpha pulls no call of its pushed tool: %w", err)
		}
		if events.CallSubject(m.Subject, m.Header) != events.SubjectToolRequested("r1", "calc2") {
			t.Errorf("alpha pulled %s", m.Subject)
		}
		return nil
	})
}

// What crosses to a team names its tools and itself only; the core's token-required
// exports name no team and no tool, so a grant never changes them.
func TestTeamExports(t *testing.T) {
	for _, tc := range []struct {
		team  string
		tools []string
	}{{"alpha", []string{"calc"}}, {"beta", []string{"search", "web"}}, {"gamma", nil}} {
		got := natsjwt.TeamExports(tc.team, tc.tools)
		if len(got) != 26*len(tc.tools)+5 {
			t.Errorf("%s: %d crossings, want 26 per tool and 5 per team", tc.team, len(got))
		}
		for _, c := range got {
			names := 0
			for _, tok := range strings.Split(c.Subject, ".") {
				for _, tool := range tc.tools {
					if tok == tool || tok == events.ToolConsumer(tool) {
						names++
					}
				}
				if tok == tc.team {
					names++
				}
			}
			// A direct get names its key twice: in the API subject and the key's subject;
			// a write and a team read name the team in the service's subject, then the
			// subject's tool or team.
			twice := strings.Contains(c.Subject, "DIRECT.GET") || strings.HasPrefix(c.Subject, events.TeamWriteSubject(tc.team, "")) ||
				strings.HasPrefix(c.Subject, events.TeamReadPrefix+"."+tc.team+".")
			if names != 1 && !(twice && names == 2) {
				t.Errorf("%s: %s names its tools or team %d times", tc.team, c.Subject, names)
			}
			if strings.HasPrefix(c.Subject, "$JS.API.") != strings.HasPrefix(c.Local, natsjwt.CoreAPIPrefix+".") {
				t.Errorf("%s: %s is imported as %q: the core's API goes under %s, nothing else", tc.team, c.Subject, c.Local, natsjwt.CoreAPIPrefix)
			}
		}
	}
	core := natsjwt.CoreExports()
	// 26 per tool, 5 per team, 8 per client identity.
	if len(core) != 39 {
		t.Errorf("the core exports %d subjects, want 39", len(core))
	}
	for _, c := range core {
		if strings.Contains(c.Subject, "any-") || c.Local != "" {
			t.Errorf("core export %s (local %q) names a tool or team", c.Subject, c.Local)
		}
	}
}
