package natsjwt_test

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/events/store"
)

// exists reports whether the core holds a message on subject in stream.
func (d *accountsDeployment) exists(stream, subject string) bool {
	d.t.Helper()
	s, err := d.core.Stream(d.ctx, stream)
	if err != nil {
		d.t.Fatal(err)
	}
	_, err = s.GetLastMsgForSubject(d.ctx, subject)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		d.t.Fatal(err)
	}
	return err == nil
}

// client connects a bound client's user, checking the settings gen wrote for it: the
// read service's prefix of its identity.
func (d *accountsDeployment) client(name, id string) *nats.Conn {
	d.t.Helper()
	want := "TOOLBUS_NATS_READ_PREFIX=" + events.ReadAPIPrefix(id)
	if env := d.res.Env[natsjwt.ClientUser(name)]; !slices.Contains(env, want) || !slices.Contains(env, natsjwt.ReadPrefixNote) {
		d.t.Fatalf("the settings of client-%s lack %s: %v", name, want, env)
	}
	return d.conn(natsjwt.ClientUser(name))
}

// The accounts layout's client accounts, in each kind of credentials, on the real
// server: client bob, in its own account, starts runs as bob (the control: the stream
// acknowledges and stores it) and reaches its identity's read service, and no route
// reaches the core or alice's: a subscription to everything hears none of a run's
// events, no JetStream API answers, a start, decision, cancel or answer as alice and
// a request to alice's read service find no responder and store nothing, and a start
// whose reply subject is a core stream's subject stores nothing but bob's start.
func TestClientAccountsBoundary(t *testing.T) {
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}},
		Clients: map[string][]string{"alice": {"alice"}, "bob": {"bob"}}}
	res := generateAccounts(t, g)
	for _, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := eventstest.Context(t, time.Minute)
			d := startAccounts(t, ctx, kind, res, "calc")
			// A stand-in for the core's read service (package reads): it answers every
			// identity, so only the boundary keeps bob from alice's reads.
			read, err := d.core.Conn().Subscribe(events.ReadServicePrefix+".*.>", func(m *nats.Msg) {
				_ = m.Respond([]byte(`{"secret":"read of ` + m.Subject + `"}`))
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = read.Unsubscribe() })
			d.client("alice", "alice")
			bob := d.client("bob", "bob")
			heard, err := bob.SubscribeSync(">")
			if err != nil {
				t.Fatal(err)
			}
			if err := bob.Flush(); err != nil {
				t.Fatal(err)
			}
			// A run of alice's, as the core's roles publish it.
			d.put(events.SubjectRunStarted("r1", "alice"), `{"secret":"alice's start"}`)
			d.put(events.SubjectToolRequested("r1", "calc"), `{"secret":"alice's args"}`)
			d.put(events.SubjectApproval("r1", true, "alice"), `{"secret":"alice's decision"}`)
			d.put(events.SubjectRunEnded("r1", "completed"), `{"secret":"alice's outcome"}`)
			d.put("$KV."+store.BucketRuns+".r1", `{"secret":"alice's run"}`)
			if err := d.core.Conn().Publish(events.SubjectRunEndedFor("r1", "calc"), []byte(`{"secret":"notice"}`)); err != nil {
				t.Fatal(err)
			}
			if err := d.core.Conn().Flush(); err != nil {
				t.Fatal(err)
			}
			// The control: bob's subscription hears its own account's traffic.
			if err := bob.Publish("bob.self", nil); err != nil {
				t.Fatal(err)
			}
			for self := false; ; {
				m, err := heard.NextMsg(time.Second)
				if err != nil {
					if !self {
						t.Fatalf("bob's subscription to > did not hear bob's own message: %v", err)
					}
					break
				}
				if m.Subject == "bob.self" {
					self = true
					continue
				}
				t.Errorf("bob, subscribed to >, heard %s: %s", m.Subject, m.Data)
			}
			if err := heard.Unsubscribe(); err != nil {
				t.Fatal(err)
			}
			probeClient(t, d, bob)
		})
	}
}

// probeClient tries, with bob's connection, every route to alice's and the core's, then
// the controls: bob's own start is stored, bob's own reads are answered.
func probeClient(t *testing.T, d *accountsDeployment, bob *nats.Conn) {
	t.Helper()
	mark := `{"x":"` + probeMark + `"}`
	for _, p := range []struct {
		name, subject, body string
		stream              string // where a write would be stored if it got through
	}{
		{name: "JetStream info", subject: "$JS.API.INFO"},
		{name: "stream info", subject: "$JS.API.STREAM.INFO.TOOLBUS"},
		{name: "stream list", subject: "$JS.API.STREAM.LIST"},
		{name: "direct get", subject: "$JS.API.DIRECT.GET.TOOLBUS", body: `{"seq":1}`},
		{name: "direct get by subject", subject: "$JS.API.DIRECT.GET.TOOLBUS.toolbus.r1.run.started.alice"},
		{name: "a run", subject: "$JS.API.DIRECT.GET.KV_toolbus_runs.$KV.toolbus_runs.r1"},
		{name: "consumer create", subject: "$JS.API.CONSUMER.CREATE.TOOLBUS", body: `{"stream_name":"TOOLBUS","config":{"durable_name":"evil","ack_policy":"explicit"}}`},
		{name: "a team's prefix", subject: natsjwt.CoreAPIPrefix + ".STREAM.INFO.TOOLBUS"},
		{name: "alice's read service", subject: events.ReadAPIPrefix("alice") + ".STREAM.INFO.TOOLBUS"},
		{name: "alice's runs", subject: events.ReadRunsSubject("alice")},
		{name: "start as alice", subject: events.SubjectRunStarted("r9", "alice"), stream: "TOOLBUS"},
		{name: "approve as alice", subject: events.SubjectApproval("r1", true, "alice"), stream: "TOOLBUS"},
		{name: "deny as alice", subject: events.SubjectApproval("r1", false, "alice"), stream: "TOOLBUS"},
		{name: "cancel as alice", subject: events.SubjectRunCancel("r1", "alice"), stream: "TOOLBUS"},
		{name: "answer as alice", subject: events.SubjectToolAnswer("r1", "alice"), stream: "TOOLBUS"},
		{name: "a forged outcome", subject: events.SubjectRunEnded("r9", "completed"), stream: "TOOLBUS"},
		{name: "a forged result", subject: events.SubjectToolFinished("r9", "calc"), stream: "TOOLBUS"},
		{name: "write a run", subject: "$KV.toolbus_runs.r9", stream: "KV_toolbus_runs"},
	} {
		d.reachesNothing(bob, "bob", p.name, p.subject, p.body, p.stream, p.subject)
	}
	d.noConsumerCreated("bob")
	// The controls: bob's start as bob is acknowledged by the core's stream and stored,
	// and bob's own identity's read service answers.
	js, err := jetstream.New(bob)
	if err != nil {
		t.Fatal(err)
	}
	if ack, err := js.Publish(d.ctx, events.SubjectRunStarted("r7", "bob"), []byte(mark)); err != nil || ack.Stream != events.DefaultStream {
		t.Fatalf("bob starts a run as bob: %v %v", ack, err)
	}
	if !d.stored("TOOLBUS", events.SubjectRunStarted("r7", "bob")) {
		t.Fatal("bob's start as bob is not stored: the probes above prove nothing")
	}
	if m, err := bob.RequestWithContext(d.ctx, events.ReadRunsSubject("bob"), nil); err != nil || !strings.Contains(string(m.Data), events.ReadRunsSubject("bob")) {
		t.Fatalf("bob's read service: %v %q", err, dataOf(m))
	}
	// The reply-subject attack: bob starts a run as bob naming a core subject as the
	// reply. The stream's acknowledgement comes back in bob's account; the core stores
	// bob's start and nothing on the reply's subject.
	for i, reply := range []string{"$KV.toolbus_runs.r8", events.SubjectRunEnded("r8", "completed")} {
		sub, err := bob.SubscribeSync(reply)
		if err != nil {
			t.Fatal(err)
		}
		subject := events.SubjectRunStarted("r8", "bob")
		if i == 1 {
			subject = events.SubjectApproval("r8", true, "bob")
		}
		if err := bob.PublishRequest(subject, reply, []byte(mark)); err != nil {
			t.Fatal(err)
		}
		if m, err := sub.NextMsg(5 * time.Second); err != nil || !strings.Contains(string(m.Data), `"stream":"TOOLBUS"`) {
			t.Fatalf("bob's start with reply %s was not acknowledged in bob's account: %v %q", reply, err, dataOf(m))
		}
		if !d.stored("TOOLBUS", subject) {
			t.Errorf("bob's own %s is not stored", subject)
		}
	}
	if d.exists("KV_toolbus_runs", "$KV.toolbus_runs.r8") || d.exists("TOOLBUS", events.SubjectRunEnded("r8", "completed")) {
		t.Error("a start of bob's with a core subject as its reply stored a message there")
	}
}

// A bound client follows its identity's run live across accounts, in each kind of
// credentials, with the core's read service on the generated injector's credentials:
// the follow (a service import answered by a stream of messages) relays alice's run
// from its start and each event the core stores after, up to its outcome; bob, in his
// account, is refused alice's run as one that does not exist, and reaches no follow of
// alice's identity. The control is alice's follow of the same run.
func TestClientFollowAcrossAccounts(t *testing.T) {
	g := natsjwt.Grants{Clients: map[string][]string{"alice": {"alice"}, "bob": {"bob"}}}
	res := generateAccounts(t, g)
	for _, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := eventstest.Context(t, time.Minute)
			d := startAccounts(t, ctx, kind, res)
			core, err := events.Open(ctx, d.conn("injector"), events.Config{})
			if err != nil {
				t.Fatal(err)
			}
			runReads(t, ctx, core)
			admin, err := events.Open(ctx, d.conn("admin"), events.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := admin.StartRun(ctx, "test", toolbus.RunStarted{RunID: "r1", Principal: toolbus.Principal{ID: "alice"},
				Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "hi"}}}); err != nil {
				t.Fatal(err)
			}
			open := func(name string) *events.Bus {
				var bus *events.Bus
				eventstest.Eventually(t, 30*time.Second, func() error {
					var err error
					bus, err = events.Open(ctx, d.client(name, name), events.Config{ReadPrefix: events.ReadAPIPrefix(name)})
					return err
				})
				return bus
			}
			alice, bob := open("alice"), open("bob")
			f, err := follow.Run(ctx, alice, "r1", 1)
			if err != nil {
				t.Fatalf("control: alice follows her run: %v", err)
			}
			defer func() { _ = f.Close() }()
			if _, err := follow.Run(ctx, bob, "r1", 1); !errors.Is(err, events.ErrNotFound) {
				t.Errorf("bob follows alice's run: %v, want ErrNotFound", err)
			}
			if _, err := d.client("bob", "bob").Request(events.FollowSubject("alice", "r1"), nil, 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
				t.Errorf("bob's account requests alice's follow: %v, want no responders", err)
			}
			// Stored after the follow began: relayed as stored.
			later := []string{events.SubjectToolRequested("r1", "calc"), events.SubjectRunEnded("r1", "completed")}
			for _, s := range later {
				d.put(s, `{"run_id":"r1"}`)
			}
			var got []string
			for {
				ev, ok, err := f.Next(ctx, time.Second)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("alice's follow after %v: %v", got, err)
				}
				if ok {
					got = append(got, ev.Subject)
				}
			}
			if want := append([]string{events.SubjectRunStarted("r1", "alice")}, later...); !slices.Equal(got, want) {
				t.Errorf("alice followed %v, want %v", got, want)
			}
		})
	}
}
