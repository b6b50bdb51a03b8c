package e2e_test

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

	"github.com/toolbus/toolbus/events/eventstest"
)

// accountsConf is the shape the tenancy design (docs/tenancy.md) rests on: the core
// account holds the stream and the tools' durable queues; a team's account sees only
// what the core exports to it, here the queue of its tool (pull, info, acknowledge) and
// its tool's result subject (a service, so the publish is acknowledged).
const accountsConf = `
listen: 127.0.0.1:-1
jetstream { store_dir: %q }
accounts {
  CORE {
    jetstream: enabled
    users: [{user: core, password: core}]
    exports: [
      {service: "$JS.API.CONSUMER.INFO.TOOLBUS.tool_calc", accounts: [ALPHA]}
      {service: "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_calc", response_type: stream, accounts: [ALPHA]}
      {service: "$JS.ACK.TOOLBUS.tool_calc.*.*.*.*.*", accounts: [ALPHA]}
      {service: "$JS.ACK.*.*.TOOLBUS.tool_calc.*.*.*.*.>", accounts: [ALPHA]}
      {service: "toolbus.*.tool.finished.calc", accounts: [ALPHA]}
      {service: "$JS.API.CONSUMER.INFO.TOOLBUS.tool_search", accounts: [BETA]}
      {service: "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_search", response_type: stream, accounts: [BETA]}
      {service: "$JS.ACK.TOOLBUS.tool_search.*.*.*.*.*", accounts: [BETA]}
      {service: "$JS.ACK.*.*.TOOLBUS.tool_search.*.*.*.*.>", accounts: [BETA]}
      {service: "toolbus.*.tool.finished.search", accounts: [BETA]}
    ]
  }
  ALPHA {
    users: [{user: alpha, password: alpha}]
    imports: [
      {service: {account: CORE, subject: "$JS.API.CONSUMER.INFO.TOOLBUS.tool_calc"}, to: "JS.core.API.CONSUMER.INFO.TOOLBUS.tool_calc"}
      {service: {account: CORE, subject: "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_calc"}, to: "JS.core.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_calc"}
      {service: {account: CORE, subject: "$JS.ACK.TOOLBUS.tool_calc.*.*.*.*.*"}}
      {service: {account: CORE, subject: "$JS.ACK.*.*.TOOLBUS.tool_calc.*.*.*.*.>"}}
      {service: {account: CORE, subject: "toolbus.*.tool.finished.calc"}}
    ]
  }
  BETA {
    users: [{user: beta, password: beta}]
    imports: [
      {service: {account: CORE, subject: "$JS.API.CONSUMER.INFO.TOOLBUS.tool_search"}, to: "JS.core.API.CONSUMER.INFO.TOOLBUS.tool_search"}
      {service: {account: CORE, subject: "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_search"}, to: "JS.core.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_search"}
      {service: {account: CORE, subject: "$JS.ACK.TOOLBUS.tool_search.*.*.*.*.*"}}
      {service: {account: CORE, subject: "$JS.ACK.*.*.TOOLBUS.tool_search.*.*.*.*.>"}}
      {service: {account: CORE, subject: "toolbus.*.tool.finished.search"}}
    ]
  }
}
`

// The boundary the tenancy design relies on, measured on the real server: a team in its
// own account pulls, reads the info of and acknowledges its own tool's durable queue in
// the core account with the plain jetstream client, and publishes its result into the
// core's stream with an acknowledgement; it cannot reach another team's queue, the core's
// JetStream API or the core's replies; a pull whose reply subject names a core stream's
// subject (the attack that defeats user permissions inside one account) is answered in
// the team's own account and stores nothing in the core.
func TestTenancyAccountsBoundary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "accounts.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(accountsConf, filepath.Join(dir, "js"))), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	srv := eventstest.StartServer(t, opts)
	ctx := eventstest.Context(t, time.Minute)
	// A team reaches the core's API under its own prefix (the imports' "to"): its
	// account's own $JS.API, which the server answers itself, stays apart.
	conn := func(user, apiPrefix string) (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user), nats.Timeout(5*time.Second))
		if err != nil {
			t.Fatalf("%s connects: %v", user, err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if apiPrefix != "" {
			js, err = jetstream.NewWithAPIPrefix(nc, apiPrefix)
		}
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	_, core := conn("core", "")
	stream, err := core.CreateStream(ctx, jetstream.StreamConfig{Name: "TOOLBUS", Subjects: []string{"toolbus.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"calc", "search"} {
		if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "tool_" + tool,
			FilterSubject: "toolbus.*.tool.requested." + tool, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	for i, subj := range []string{"toolbus.r1.tool.requested.calc", "toolbus.r1.tool.requested.search", "toolbus.r2.tool.requested.calc"} {
		if _, err := core.Publish(ctx, subj, []byte(fmt.Sprintf(`{"secret":"args %d"}`, i))); err != nil {
			t.Fatal(err)
		}
	}

	// alpha takes its own call, answers it and acknowledges it across the boundary.
	alphaNC, alpha := conn("alpha", "JS.core.API")
	cons, err := alpha.Consumer(ctx, "TOOLBUS", "tool_calc")
	if err != nil {
		t.Fatalf("alpha binds its queue through the imports: %v", err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got jetstream.Msg
	for m := range batch.Messages() {
		got = m
	}
	if got == nil || got.Subject() != "toolbus.r1.tool.requested.calc" {
		t.Fatalf("alpha's pull: %v %v", got, batch.Error())
	}
	ack, err := alpha.Publish(ctx, "toolbus.r1.tool.finished.calc", []byte(`{"ok":true}`))
	if err != nil || ack.Stream != "TOOLBUS" {
		t.Fatalf("alpha's result into the core stream: %v %v", ack, err)
	}
	if err := got.DoubleAck(ctx); err != nil {
		t.Fatalf("alpha acknowledges across the boundary: %v", err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		ci, err := stream.Consumer(ctx, "tool_calc")
		if err != nil {
			return err
		}
		if info := ci.CachedInfo(); info.AckFloor.Consumer < 1 {
			return fmt.Errorf("ack floor %d", info.AckFloor.Consumer)
		}
		return nil
	})

	// Nothing else crosses: beta's queue, the core's JetStream API, direct gets, other
	// teams' result subjects.
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }
	for _, subj := range []string{"JS.core.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_search", "JS.core.API.CONSUMER.INFO.TOOLBUS.tool_search",
		"$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_search", "JS.core.API.STREAM.INFO.TOOLBUS",
		"$JS.API.STREAM.INFO.TOOLBUS", "$JS.API.DIRECT.GET.TOOLBUS", "$JS.API.STREAM.MSG.GET.TOOLBUS", "$JS.API.CONSUMER.CREATE.TOOLBUS",
		"toolbus.r1.tool.finished.search", "toolbus.r1.run.completed"} {
		c, cancel := short()
		body := `{"seq":1,"batch":1}`
		if strings.Contains(subj, "CONSUMER.CREATE") {
			body = `{"stream_name":"TOOLBUS","config":{"durable_name":"evil","ack_policy":"explicit"}}`
		}
		m, err := alphaNC.RequestWithContext(c, subj, []byte(body))
		cancel()
		switch {
		case err == nil && strings.HasPrefix(subj, "$JS.API.") && strings.Contains(string(m.Data), `"error"`):
			// alpha's own account's API answered with an error: it has no JetStream of
			// its own (below: no consumer appeared in the core).
		case errors.Is(err, nats.ErrNoResponders), errors.Is(err, context.DeadlineExceeded):
		default:
			t.Errorf("alpha reached %s: %v %s", subj, err, dataOf(m))
		}
	}
	if _, err := stream.Consumer(ctx, "evil"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("alpha created a consumer in the core: %v", err)
	}
	// The reply-subject attack: alpha pulls its own queue naming a core subject as the
	// reply; the server answers in alpha's account, and the core stream stores nothing.
	sub, err := alphaNC.SubscribeSync("toolbus.r2.run.completed")
	if err != nil {
		t.Fatal(err)
	}
	if err := alphaNC.PublishRequest("JS.core.API.CONSUMER.MSG.NEXT.TOOLBUS.tool_calc", "toolbus.r2.run.completed", []byte(`{"batch":1,"expires":1000000000}`)); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || !strings.Contains(string(m.Data), "args 2") {
		t.Fatalf("the pull's answer did not come back to alpha's own subject: %v %v", m, err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, "toolbus.r2.run.completed"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("alpha's pull stored a message in the core stream: %v", err)
	}
	// beta, subscribed to every inbox and every subject of its account, hears none of
	// alpha's or the core's traffic.
	betaNC, _ := conn("beta", "JS.core.API")
	heard, err := betaNC.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := core.Publish(ctx, "toolbus.r3.tool.requested.calc", []byte(`{"secret":"args 3"}`)); err != nil {
		t.Fatal(err)
	}
	if b2, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second)); err == nil {
		for m := range b2.Messages() {
			_ = m.Ack()
		}
	}
	if m, err := heard.NextMsg(time.Second); err == nil {
		t.Fatalf("beta heard %s: %s", m.Subject, m.Data)
	}
}

func dataOf(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}
