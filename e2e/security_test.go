package e2e_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

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

// Security: every role connects with its own credentials to a server that requires
// them, configured by the files of deploy/nats (loaded as they are, only the addresses
// and the store directory changed). The admin sets the bus up (what `toolbus init`
// does); every other role only binds, and may do only what its role does.

// runOnce submits a run as the client and waits for it to complete.
func (s *secured) runOnce(run string) {
	t := s.t
	t.Helper()
	err := s.buses["client"].StartRun(s.ctx, events.Source("cli", "sec"), toolbus.RunStarted{
		RunID: run, Principal: toolbus.Principal{ID: "sec-tester"},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "2+3?"}},
	})
	if err != nil {
		t.Fatalf("client starts a run: %v", err)
	}
	client := s.buses["client"]
	eventstest.Eventually(t, 60*time.Second, func() error {
		if _, err := client.EventStream().GetLastMsgForSubject(s.ctx, events.SubjectRunEnded(run, toolbus.RunCompleted)); err != nil {
			return fmt.Errorf("run %s not completed: %w (violations %v)", run, err, s.viol.all())
		}
		return nil
	})
	if v := s.viol.all(); len(v) > 0 {
		t.Fatalf("the roles hit permission violations: %v", v)
	}
}

// forbidden checks that role may not publish an event on subject: the server refuses it
// (a permissions violation) and the stream does not store it.
func (s *secured) forbidden(role, subject string) {
	t := s.t
	t.Helper()
	js, err := jetstream.New(s.conns[role])
	if err != nil {
		t.Fatal(err)
	}
	msg := encodeOrFail(t, subject, events.Meta{ID: "forged-" + role + "-" + subject, Type: events.TypeRunStarted, Source: "/evil"}, map[string]string{"run_id": "evil"})
	ctx, cancel := context.WithTimeout(s.ctx, time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, msg); err == nil {
		t.Fatalf("%s published to %s", role, subject)
	}
	eventstest.Eventually(t, 5*time.Second, func() error {
		if s.viol.has(role, subject) {
			return nil
		}
		return fmt.Errorf("no violation recorded for %s on %s: %v", role, subject, s.viol.all())
	})
	if _, err := s.buses["admin"].EventStream().GetLastMsgForSubject(s.ctx, subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the stream has a message on %s: %v", subject, err)
	}
}

// eventOwners maps each event subject (of run "evil") to the roles that may publish it.
var eventOwners = map[string][]string{
	"run.started":                 {"client"},
	"run.cancel":                  {"client"},
	"approval.granted":            {"client"},
	"approval.denied":             {"client"},
	"model.requested":             {"injector"},
	"model.responded":             {"planner"},
	"tool.requested.noop":         {"planner", "injector"},
	"tool.finished.noop":          {"executor", "planner", "injector"},
	"tool.waiting.noop":           {"executor"},
	"run.completed":               {"planner", "injector"},
	"run.failed":                  {"planner", "injector"},
	"run.limit_reached":           {"planner", "injector"},
	"run.cancelled":               {"planner", "injector"},
	"run.waiting_for_approval":    {"injector"},
	"timer.deadline":              {"injector"},
	"some.event.nobody.publishes": nil,
}

// attack is an operation a role must not be able to do: the server refuses it with a
// permissions violation on subject.
type attack struct {
	name    string
	subject string
	do      func(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error
}

// roleAttacks lists everything role may not do: change or delete the stream or its
// messages, delete or take over consumers, pull or acknowledge another role's work,
// write buckets it does not own, publish events it does not own, eavesdrop.
func roleAttacks(t *testing.T, role string) []attack {
	stream := events.DefaultStream
	api := func(name, subject string, do func(context.Context, jetstream.JetStream) error) attack {
		return attack{name: name, subject: subject, do: func(ctx context.Context, _ *nats.Conn, js jetstream.JetStream) error { return do(ctx, js) }}
	}
	as := []attack{
		api("stream update (MaxMsgs=1)", "$JS.API.STREAM.UPDATE."+stream, func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{events.FilterAll}, MaxMsgs: 1})
			return err
		}),
		api("stream update (subject transform)", "$JS.API.STREAM.UPDATE."+stream, func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{events.FilterAll},
				SubjectTransform: &jetstream.SubjectTransformConfig{Source: "toolbus.*.run.started", Destination: "toolbus.$1.tool.finished.noop"}})
			return err
		}),
		api("stream delete", "$JS.API.STREAM.DELETE."+stream, func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteStream(ctx, stream)
		}),
		api("stream purge", "$JS.API.STREAM.PURGE."+stream, func(ctx context.Context, js jetstream.JetStream) error {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return err
			}
			return st.Purge(ctx)
		}),
		api("message delete", "$JS.API.STREAM.MSG.DELETE."+stream, func(ctx context.Context, js jetstream.JetStream) error {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return err
			}
			return st.DeleteMsg(ctx, 1)
		}),
		api("read mirror purge", "$JS.API.STREAM.PURGE."+events.ReadMirrorName(stream), func(ctx context.Context, js jetstream.JetStream) error {
			st, err := js.Stream(ctx, events.ReadMirrorName(stream))
			if err != nil {
				return err
			}
			return st.Purge(ctx)
		}),
		api("bucket delete", "$JS.API.STREAM.DELETE.KV_"+store.BucketRuns, func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteKeyValue(ctx, store.BucketRuns)
		}),
		api("ephemeral consumer on the event stream", "$JS.API.CONSUMER.CREATE."+stream+".sneaky.toolbus.>", func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Name: "sneaky", FilterSubject: "toolbus.>"})
			return err
		}),
		{name: "legacy ephemeral create naming the planner's durable", subject: "$JS.API.CONSUMER.CREATE." + stream,
			do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
				req := `{"stream_name":"` + stream + `","config":{"name":"planner","filter_subject":"toolbus.>","ack_policy":"none"}}`
				_, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.CREATE."+stream, []byte(req))
				return err
			}},
	}
	// Readers create no consumer anywhere (they read with direct gets), so a client or
	// the planner cannot fill a stream's consumer limit: every create form is refused.
	if role == "client" || role == "planner" {
		for _, st := range []string{"KV_" + store.BucketTools, "KV_" + store.BucketRuns, "KV_" + store.BucketInstances, events.ReadMirrorName(stream)} {
			as = append(as,
				api("durable consumer on "+st, "$JS.API.CONSUMER.CREATE."+st+".squat", func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.CreateConsumer(ctx, st, jetstream.ConsumerConfig{Durable: "squat", AckPolicy: jetstream.AckNonePolicy})
					return err
				}),
				attack{name: "legacy durable create on " + st, subject: "$JS.API.CONSUMER.DURABLE.CREATE." + st + ".squat2",
					do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
						req := `{"stream_name":"` + st + `","config":{"durable_name":"squat2","ack_policy":"none"}}`
						_, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.DURABLE.CREATE."+st+".squat2", []byte(req))
						return err
					}},
				attack{name: "legacy ephemeral create on " + st, subject: "$JS.API.CONSUMER.CREATE." + st,
					do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
						req := `{"stream_name":"` + st + `","config":{"ack_policy":"none"}}`
						_, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.CREATE."+st, []byte(req))
						return err
					}})
		}
	}
	// Every durable, including the role's own, is the admin's: no delete, no update.
	for _, c := range []string{events.ConsumerPlanner, events.ConsumerInjector, events.ConsumerInjectorApprovals, events.ToolConsumer("calculator")} {
		as = append(as,
			api("consumer delete "+c, "$JS.API.CONSUMER.DELETE."+streamOf(c)+"."+c, func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteConsumer(ctx, streamOf(c), c)
			}),
			api("consumer update "+c, "$JS.API.CONSUMER.CREATE."+streamOf(c)+"."+c+".toolbus.>", func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateOrUpdateConsumer(ctx, streamOf(c), jetstream.ConsumerConfig{Durable: c, FilterSubject: "toolbus.>", AckPolicy: jetstream.AckExplicitPolicy})
				return err
			}))
	}
	// Pulling from another role's queue steals its work.
	own := map[string][]string{
		"planner":  {events.ConsumerPlanner},
		"injector": {events.ConsumerInjector, events.ConsumerInjectorApprovals},
		"executor": {events.ToolConsumer("calculator")},
	}
	for owner, names := range own {
		if owner == role {
			continue
		}
		for _, c := range names {
			subj := "$JS.API.CONSUMER.MSG.NEXT." + streamOf(c) + "." + c
			as = append(as, attack{name: "pull from " + c, subject: subj, do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
				_, err := nc.RequestWithContext(ctx, subj, []byte(`{"batch":1,"no_wait":true}`))
				return err
			}})
		}
	}
	// Buckets the role does not write.
	writes := map[string][]string{
		"planner":  {store.BucketHistory, store.BucketRuns},
		"injector": {store.BucketHistory, store.BucketRuns, store.BucketApprovals},
		"executor": {store.BucketClaims, store.BucketInstances, store.BucketTools},
		"client":   nil,
	}
	for _, bk := range []string{store.BucketRuns, store.BucketHistory, store.BucketApprovals, store.BucketTools, store.BucketClaims, store.BucketInstances} {
		if slices.Contains(writes[role], bk) {
			continue
		}
		subj := "$KV." + bk + ".sec-victim"
		as = append(as, attack{name: "kv put " + bk, subject: subj, do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
			return publishAndFlush(ctx, nc, subj, []byte(`{"status":"completed"}`))
		}})
	}
	// The executors' shared secrets (OAuth tokens of MCP servers): no other role reads
	// or writes them.
	if role != "executor" {
		key := store.SecretKey("", "sec-victim")
		get := "$JS.API.DIRECT.GET.KV_" + store.BucketSecrets + ".$KV." + store.BucketSecrets + "." + key
		msgGet := "$JS.API.STREAM.MSG.GET.KV_" + store.BucketSecrets
		as = append(as,
			attack{name: "read a shared secret", subject: get, do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
				_, err := nc.RequestWithContext(ctx, get, nil)
				return err
			}},
			attack{name: "read a shared secret (message get)", subject: msgGet, do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
				_, err := nc.RequestWithContext(ctx, msgGet, []byte(`{"last_by_subj":"$KV.`+store.BucketSecrets+`.`+key+`"}`))
				return err
			}},
			attack{name: "kv put " + store.BucketSecrets, subject: "$KV." + store.BucketSecrets + "." + key, do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
				return publishAndFlush(ctx, nc, "$KV."+store.BucketSecrets+"."+key, []byte(`{}`))
			}})
	}
	// Events the role does not own.
	for ev, owners := range eventOwners {
		if slices.Contains(owners, role) {
			continue
		}
		subj := "toolbus.evil-" + role + "." + ev
		msg := encodeOrFail(t, subj, events.Meta{ID: "forged-" + role + "-" + ev, Type: events.TypeRunStarted, Source: "/evil", RunID: "evil-" + role}, map[string]string{"run_id": "evil-" + role})
		as = append(as, attack{name: "publish " + ev, subject: subj, do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
			return publishAndFlush(ctx, nc, msg.Subject, msg.Data, msg.Header)
		}})
	}
	as = append(as, attack{name: "eavesdrop on every event", subject: "toolbus.>", do: func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
		sub, err := nc.SubscribeSync("toolbus.>")
		if err != nil {
			return err
		}
		defer sub.Unsubscribe() //nolint:errcheck
		return nc.FlushWithContext(ctx)
	}})
	return as
}

// publishAndFlush publishes on core NATS; a refusal arrives as an async violation.
func publishAndFlush(ctx context.Context, nc *nats.Conn, subject string, data []byte, hdr ...nats.Header) error {
	m := nats.NewMsg(subject)
	m.Data = data
	if len(hdr) > 0 {
		m.Header = hdr[0]
	}
	if err := nc.PublishMsg(m); err != nil {
		return err
	}
	return nc.FlushWithContext(ctx)
}

// checkRoles runs every attack of every role on a fresh connection with the role's
// credentials, all at once, and checks that the server refused each (a permissions
// violation on its subject) and that nothing changed: the stream keeps its
// configuration and every event, the consumers keep theirs, the buckets their values,
// and no forged event is stored. Then a second run completes.
func (s *secured) checkRoles() {
	t := s.t
	t.Helper()
	admin := s.buses["admin"]
	before, err := admin.EventStream().Info(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	consumersBefore := map[string]jetstream.ConsumerConfig{}
	for _, c := range []string{events.ConsumerPlanner, events.ConsumerInjector, events.ConsumerInjectorApprovals, events.ToolConsumer("calculator")} {
		ci, err := admin.JetStream().Consumer(s.ctx, streamOf(c), c)
		if err != nil {
			t.Fatalf("consumer %s: %v", c, err)
		}
		consumersBefore[c] = ci.CachedInfo().Config
	}
	attackers := &violations{}
	type outcome struct {
		role string
		a    attack
		err  error
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []outcome
	)
	for _, role := range secRoles {
		nc, err := connectAs(t, s.url, role, attackers, s.opts[role]...)
		if err != nil {
			t.Fatalf("%s connects: %v", role, err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range roleAttacks(t, role) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
				defer cancel()
				err := a.do(ctx, nc, js)
				mu.Lock()
				results = append(results, outcome{role, a, err})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	eventstest.Eventually(t, 30*time.Second, func() error {
		for _, r := range results {
			if !attackers.has(r.role, r.a.subject) {
				return fmt.Errorf("%s: %s: no permissions violation on %s (err %v)", r.role, r.a.name, r.a.subject, r.err)
			}
		}
		return nil
	})
	refused := 0
	for _, r := range results {
		// Requests get no answer at all: the server dropped them.
		if strings.HasPrefix(r.a.subject, "$JS.API.") && r.err == nil {
			t.Errorf("%s: %s: the request was answered", r.role, r.a.name)
		}
		refused++
	}
	t.Logf("%d forbidden operations refused across %d roles", refused, len(secRoles))

	after, err := admin.EventStream().Info(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before.Config, after.Config) || after.State.Msgs < before.State.Msgs || after.State.FirstSeq != before.State.FirstSeq {
		t.Fatalf("the stream changed: config %+v -> %+v, state %+v -> %+v", before.Config, after.Config, before.State, after.State)
	}
	if !after.Config.DenyDelete || !after.Config.DenyPurge {
		t.Fatalf("the stream does not deny delete and purge: %+v", after.Config)
	}
	for c, cfg := range consumersBefore {
		ci, err := admin.JetStream().Consumer(s.ctx, streamOf(c), c)
		if err != nil {
			t.Fatalf("consumer %s after the attacks: %v", c, err)
		}
		if got := ci.CachedInfo().Config; got.FilterSubject != cfg.FilterSubject || got.AckPolicy != cfg.AckPolicy || got.AckWait != cfg.AckWait {
			t.Fatalf("consumer %s changed: %+v -> %+v", c, cfg, got)
		}
	}
	if _, err := admin.EventStream().Consumer(s.ctx, "sneaky"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("the sneaky consumer exists: %v", err)
	}
	for _, role := range secRoles {
		for ev := range eventOwners {
			subj := "toolbus.evil-" + role + "." + ev
			if slices.Contains(eventOwners[ev], role) {
				continue
			}
			if _, err := admin.EventStream().GetLastMsgForSubject(s.ctx, subj); !errors.Is(err, jetstream.ErrMsgNotFound) {
				t.Fatalf("the stream stored a forged %s: %v", subj, err)
			}
		}
	}
	for _, bk := range []string{store.BucketRuns, store.BucketHistory, store.BucketApprovals, store.BucketTools, store.BucketClaims, store.BucketInstances} {
		kv, err := admin.JetStream().KeyValue(s.ctx, bk)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Get(s.ctx, "sec-victim"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("a role wrote key sec-victim of %s: %v", bk, err)
		}
	}
}

// clientReads checks what the client needs to follow and list runs: an ordered
// consumer on the read mirror (toolbus run, tail, replay), the run list (a KV watch).
func (s *secured) clientReads(run string) {
	t := s.t
	t.Helper()
	client := s.buses["client"]
	if client.Reader().CachedInfo().Config.Name != events.ReadMirrorName(events.DefaultStream) {
		t.Fatalf("the client reads from %s, want the read mirror", client.Reader().CachedInfo().Config.Name)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		evs, err := runlog.Events(s.ctx, client, run)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if ev.Subject == events.SubjectRunEnded(run, toolbus.RunCompleted) {
				return nil
			}
		}
		return fmt.Errorf("the client's read of %s has no run.completed yet", run)
	})
	runs, err := client.Store().Runs(s.ctx)
	if err != nil {
		t.Fatalf("client lists runs: %v", err)
	}
	found := false
	for _, r := range runs {
		found = found || r.RunID == run
	}
	if !found {
		t.Fatalf("run %s not listed: %+v", run, runs)
	}
}

// executorSecrets checks that the executor's credentials write and read its shared
// secrets (toolbus_secrets), with compare-and-set, which checkRoles denies the others.
func (s *secured) executorSecrets() {
	t := s.t
	t.Helper()
	sec, err := s.buses["executor"].Secrets(s.ctx, "")
	if err != nil {
		t.Fatalf("the executor opens its secrets: %v", err)
	}
	rev, ok, err := sec.Swap(s.ctx, "sec-own", []byte(`{"token":"x"}`), 0)
	if err != nil || !ok {
		t.Fatalf("the executor writes a secret: %v, swapped %v", err, ok)
	}
	if _, ok, err := sec.Swap(s.ctx, "sec-own", []byte(`{}`), 0); err != nil || ok {
		t.Fatalf("a second create of the secret: %v, swapped %v (want a lost compare-and-set)", err, ok)
	}
	if v, r, err := sec.Load(s.ctx, "sec-own"); err != nil || r != rev || string(v) != `{"token":"x"}` {
		t.Fatalf("the executor reads its secret: %q rev %d (want %d), %v", v, r, rev, err)
	}
}

// The role table, for each way deploy/nats gives credentials: a full run with every
// role on its own credentials, every forbidden operation of every role refused by the
// server with nothing changed, the client's reads, and another full run after the
// attacks.
func TestSecurityRoles(t *testing.T) {
	t.Parallel()
	for _, mode := range credentialKinds() {
		t.Run(mode.name, func(t *testing.T) {
			url, opts := mode.start(t)
			s := startSecured(t, url, opts)
			s.runOnce("sec-" + mode.name + "-1")
			s.clientReads("sec-" + mode.name + "-1")
			s.checkRoles()
			s.executorSecrets()
			s.runOnce("sec-" + mode.name + "-2")
		})
	}
}

// Refused logins: no or wrong credentials, an unknown user, nkey or account.
func TestSecurityRefusedLogins(t *testing.T) {
	t.Parallel()
	pw, vars := newPasswords()
	srv := startConfigured(t, "auth-users.conf", vars)
	url := srv.ClientURL()
	for _, c := range []struct{ name, user, pass string }{
		{"no credentials", "", ""}, {"wrong password", "executor", "guess"}, {"unknown user", "root", pw["executor"]},
		{"the admin with the client's password", "admin", pw["client"]},
	} {
		var o []nats.Option
		if c.user != "" {
			o = append(o, nats.UserInfo(c.user, c.pass))
		}
		if _, err := connectAs(t, url, "intruder", nil, o...); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Fatalf("%s: connect error %v, want an authorization violation", c.name, err)
		}
	}

	dir, nvars := t.TempDir(), map[string]string{}
	for _, role := range allRoles {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		nvars["TOOLBUS_"+strings.ToUpper(role)+"_NKEY"] = pub
	}
	nsrv := startConfigured(t, "auth-nkeys.conf", nvars)
	stranger, _ := nkeys.CreateUser()
	seed, _ := stranger.Seed()
	o, err := nats.NkeyOptionFromSeed(writeFile(t, dir, "stranger.nk", seed))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := connectAs(t, nsrv.ClientURL(), "stranger", nil, o); err == nil {
		t.Fatal("an unknown nkey connected")
	}

	res, err := natsjwt.Generate(filepath.Join("..", "deploy", "nats", "permissions.conf"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	jsrv := startConfigured(t, res.Config, nil)
	other, _ := nkeys.CreateAccount()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	badJWT, err := jwt.NewUserClaims(upub).Encode(other)
	if err != nil {
		t.Fatal(err)
	}
	useed, _ := ukp.Seed()
	b, err := jwt.FormatUserConfig(badJWT, useed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := connectAs(t, jsrv.ClientURL(), "stranger", nil, nats.UserCredentials(writeFile(t, dir, "stranger.creds", b))); err == nil {
		t.Fatal("a user of an unknown account connected")
	}
}

// A role without the admin's rights cannot set the bus up: Open names toolbus init.
func TestSecurityOpenNeedsInit(t *testing.T) {
	t.Parallel()
	pw, vars := newPasswords()
	srv := startConfigured(t, "auth-users.conf", vars)
	nc, err := connectAs(t, srv.ClientURL(), "planner", nil, nats.UserInfo("planner", pw["planner"]))
	if err != nil {
		t.Fatal(err)
	}
	_, err = events.Open(eventstest.Context(t, 30*time.Second), nc, events.Config{})
	if !errors.Is(err, events.ErrNotSetUp) || !strings.Contains(err.Error(), "toolbus init") {
		t.Fatalf("open before init: %v, want ErrNotSetUp naming toolbus init", err)
	}
}

// testPKI is a CA with a server certificate (127.0.0.1, localhost) and a client
// certificate, plus a client certificate of another CA.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey, otherCert, otherKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	leaf := func(name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	}
	ca, caKey, caPEM := newCA("toolbus test CA")
	other, otherKey, _ := newCA("some other CA")
	sc, sk := leaf("nats-server", ca, caKey, x509.ExtKeyUsageServerAuth)
	cc, ck := leaf("toolbus-client", ca, caKey, x509.ExtKeyUsageClientAuth)
	oc, ok := leaf("toolbus-client", other, otherKey, x509.ExtKeyUsageClientAuth)
	return testPKI{
		ca: writeFile(t, dir, "ca.pem", caPEM), serverCert: writeFile(t, dir, "server.pem", sc), serverKey: writeFile(t, dir, "server-key.pem", sk),
		clientCert: writeFile(t, dir, "client.pem", cc), clientKey: writeFile(t, dir, "client-key.pem", ck),
		otherCert: writeFile(t, dir, "other.pem", oc), otherKey: writeFile(t, dir, "other-key.pem", ok),
	}
}

// Mutual TLS with a CA (deploy/nats/tls.conf): the client verifies the server with the
// CA, the server requires a client certificate of the CA, plus user and password.
func TestSecurityTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	pw, vars := newPasswords()
	vars["NATS_TLS_CERT"], vars["NATS_TLS_KEY"], vars["NATS_TLS_CA"] = pki.serverCert, pki.serverKey, pki.ca
	srv := startConfigured(t, "tls.conf", vars)
	url := strings.Replace(srv.ClientURL(), "nats://", "tls://", 1)
	opts := map[string][]nats.Option{}
	for _, role := range allRoles {
		opts[role] = []nats.Option{nats.RootCAs(pki.ca), nats.ClientCert(pki.clientCert, pki.clientKey), nats.UserInfo(role, pw[role])}
	}
	s := startSecured(t, url, opts)
	s.runOnce("sec-tls-1")
	s.forbidden("client", "toolbus.evil.tool.finished.noop")

	for _, c := range []struct {
		name string
		opts []nats.Option
		want string
	}{
		{"no CA: the server is not trusted", []nats.Option{nats.ClientCert(pki.clientCert, pki.clientKey), nats.UserInfo("client", pw["client"])}, "certificate"},
		{"no client certificate", []nats.Option{nats.RootCAs(pki.ca), nats.UserInfo("client", pw["client"])}, ""},
		{"a client certificate of another CA", []nats.Option{nats.RootCAs(pki.ca), nats.ClientCert(pki.otherCert, pki.otherKey), nats.UserInfo("client", pw["client"])}, ""},
		{"no TLS options on a nats:// URL", []nats.Option{nats.UserInfo("client", pw["client"])}, ""},
	} {
		u := url
		if strings.HasPrefix(c.name, "no TLS options") {
			u = srv.ClientURL()
		}
		_, err := connectAs(t, u, "intruder", nil, c.opts...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: connect error %v, want a refusal", c.name, err)
		}
		t.Logf("%s: refused: %v", c.name, err)
	}
}

// The run's allowlist: run.started names the allowed tools; the planner offers only
// those, and a call of another (known) tool is rejected as not_authorized, without
// running, and goes back to the model.
func TestSecurityToolAllowlist(t *testing.T) {
	t.Parallel()
	var calcRuns int
	var mu sync.Mutex
	spy := executor.Tool{Name: "spy_calc", Description: "counts its runs", InputSchema: objectSchema, ReadOnly: true,
		Func: func(context.Context, json.RawMessage) (any, error) {
			mu.Lock()
			calcRuns++
			mu.Unlock()
			return map[string]int{"n": 5}, nil
		}}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "spy_calc", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, spy)
	s.startAll()
	s.submit("allow-1", toolbus.Limits{}, "noop")
	if ended := s.waitEnd("allow-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("status %s (%s)", ended.Status, ended.Reason)
	}
	res := s.finished("allow-1")
	byCall := map[string]toolbus.ToolResult{}
	for _, tf := range res {
		byCall[tf.ToolResult.CallID] = tf.ToolResult
	}
	if r := byCall["a"]; r.Status != toolbus.StatusSucceeded {
		t.Fatalf("allowed call: %+v", r)
	}
	if r := byCall["b"]; r.Status != toolbus.StatusRejected || r.Code() != toolbus.CodeNotAuthorized {
		t.Fatalf("call of a tool outside the allowlist: %+v, want rejected/not_authorized", r)
	}
	mu.Lock()
	n := calcRuns
	mu.Unlock()
	if n != 0 {
		t.Fatalf("the tool outside the allowlist ran %d times", n)
	}
	req, ok := s.seenReq.forStep("allow-1", 0)
	if !ok {
		t.Fatal("no model request for step 0")
	}
	var offered []string
	for _, tc := range req.Tools {
		offered = append(offered, tc.Name)
	}
	if !reflect.DeepEqual(offered, []string{"noop"}) {
		t.Fatalf("tools offered to the model: %v, want only noop", offered)
	}
	next, _ := s.seenReq.forStep("allow-1", 1)
	found := false
	for _, m := range next.Messages {
		if m.Role == toolbus.RoleTool && m.ToolCallID == "b" && m.IsError && strings.Contains(m.Content, "not allowed") {
			found = true
		}
	}
	if !found {
		t.Fatalf("the model did not read the refusal: %+v", next.Messages)
	}
	t.Logf("refused: %s", byCall["b"].Content)
}

// The principal of the run (run.started) reaches the executor's authorization hook with
// the tool and its arguments; the hook's refusal is a rejected/not_authorized result.
func TestSecurityPrincipalReachesAuthorizer(t *testing.T) {
	t.Parallel()
	type seen struct {
		p    toolbus.Principal
		tool string
		args string
	}
	var (
		mu  sync.Mutex
		got []seen
	)
	auth := executor.AuthorizerFunc(func(_ context.Context, p toolbus.Principal, tool string, args json.RawMessage) error {
		mu.Lock()
		got = append(got, seen{p, tool, string(args)})
		mu.Unlock()
		if tool == "calculator" && !slices.Contains(p.Roles, "oncall") {
			return executor.NewError(toolbus.CodeNotAuthorized, "calculator needs the oncall role")
		}
		return nil
	})
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "calculator", `{"expression":"6*7"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	s.start("exec-auth", must(worker.New(s.bus,
		must(executor.New(s.reg, executor.WithAuthorizer(auth), executor.WithInstance("exec-auth"), executor.WithLogger(s.log))),
		worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "exec-auth", Grace: time.Second, Logger: s.log}})).Run)
	eventstest.Eventually(t, 10*time.Second, func() error {
		cat, err := s.bus.Store().WatchCatalog(s.ctx, nil)
		if err != nil {
			return err
		}
		if _, ok := cat.Lookup("calculator"); !ok {
			return errors.New("catalog without calculator")
		}
		return nil
	})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	principals := map[string]toolbus.Principal{
		"auth-alice": {ID: "alice", Roles: []string{"oncall", "sre"}, Attrs: map[string]string{"team": "payments", "tenant": "t-1"}},
		"auth-bob":   {ID: "bob", Roles: []string{"viewer"}},
	}
	for run, p := range principals {
		err := s.bus.StartRun(s.ctx, "/test", toolbus.RunStarted{RunID: run, Principal: p,
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "6*7?"}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	for run := range principals {
		if ended := s.waitEnd(run); ended.Status != toolbus.RunCompleted {
			t.Fatalf("%s: %s (%s)", run, ended.Status, ended.Reason)
		}
	}
	if r := s.finished("auth-alice")[0].ToolResult; r.Status != toolbus.StatusSucceeded || !strings.Contains(r.Content, "42") {
		t.Fatalf("alice: %+v", r)
	}
	r := s.finished("auth-bob")[0].ToolResult
	if r.Status != toolbus.StatusRejected || r.Code() != toolbus.CodeNotAuthorized || !strings.Contains(r.Content, "oncall role") {
		t.Fatalf("bob: %+v, want rejected/not_authorized", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("the hook ran %d times, want 2: %+v", len(got), got)
	}
	for _, g := range got {
		want := principals["auth-"+g.p.ID]
		if !reflect.DeepEqual(g.p, want) || g.tool != "calculator" || g.args != `{"expression":"6*7"}` {
			t.Fatalf("the hook saw %+v, want principal %+v, calculator and the call's arguments", g, want)
		}
	}
	t.Logf("bob refused: %s", r.Content)
}

// Executors take the allowlist and the principal from the run's first run.started, never
// from the call: a forged tool.requested (from a party allowed to publish calls) that
// names a tool outside the run's allowlist and grants it, or that names another
// principal, is rejected as not_authorized, or runs with the run's own principal.
func TestForgedCallCannotGrantToolsOrPrincipal(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []string // principal ids the authorizer was given
	)
	auth := executor.AuthorizerFunc(func(_ context.Context, p toolbus.Principal, _ string, _ json.RawMessage) error {
		mu.Lock()
		seen = append(seen, p.ID)
		mu.Unlock()
		return nil
	})
	s := newStack(t, &planner.Script{})
	s.start("exec-auth", must(worker.New(s.bus,
		must(executor.New(s.reg, executor.WithAuthorizer(auth), executor.WithInstance("exec-auth"), executor.WithLogger(s.log))),
		worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "exec-auth", Grace: time.Second, Logger: s.log}})).Run)
	// Every queue is bound (the catalog is published after them) before a call is sent.
	eventstest.Eventually(t, 20*time.Second, func() error {
		cat, err := s.bus.Store().WatchCatalog(s.ctx, nil)
		if err != nil {
			return err
		}
		for _, name := range s.reg.Names() {
			if _, ok := cat.Lookup(name); !ok {
				return fmt.Errorf("catalog without %s", name)
			}
		}
		return nil
	})
	// No planner: the run stays running at step 0, and only the forged calls reach the
	// executor.
	s.startInjector("injector-1")
	const run = "forged-grant"
	s.submit(run, toolbus.Limits{}, "noop") // principal "tester", only noop allowed
	eventstest.Eventually(t, 20*time.Second, func() error {
		_, err := s.bus.Store().CurrentStep(s.ctx, run)
		return err
	})
	forged := []toolbus.ToolRequested{
		{RunID: run, CallIndex: 0, CallCount: 2, Call: call("z1", "calculator", `{"expression":"1+1"}`),
			AllowedTools: []string{"calculator", "noop"}, Principal: toolbus.Principal{ID: "tester"}},
		{RunID: run, CallIndex: 1, CallCount: 2, Call: call("z2", "noop", `{}`),
			AllowedTools: []string{"noop"}, Principal: toolbus.Principal{ID: "mallory", Roles: []string{"admin"}}},
	}
	for _, tr := range forged {
		if _, err := s.bus.PublishEvent(s.ctx, events.ToolRequestedEvent("/evil", tr, true)); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]toolbus.ToolResult{}
	eventstest.Eventually(t, 30*time.Second, func() error {
		for _, tf := range s.finished(run) {
			got[tf.CallID] = tf.ToolResult
		}
		if len(got) < 2 {
			return fmt.Errorf("results %v", got)
		}
		return nil
	})
	if r := got["z1"]; r.Status != toolbus.StatusRejected || r.Code() != toolbus.CodeNotAuthorized {
		t.Fatalf("a call granting itself calculator: %+v, want rejected/not_authorized", r)
	}
	if r := got["z2"]; r.Status != toolbus.StatusSucceeded {
		t.Fatalf("the forged noop call: %+v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "tester" {
		t.Fatalf("the authorizer was given %v, want the run's principal tester once", seen)
	}
}

// streamOf is the stream of a durable of the default stream (events.DurableStream).
func streamOf(consumer string) string { return events.DurableStream(events.DefaultStream, consumer) }
