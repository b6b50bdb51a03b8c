package natsjwt_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/teamqueue"
)

// coreNext is the pull subject of calc's queue in the core account, and nextIn alpha's.
var (
	coreNext = "$JS.API.CONSUMER.MSG.NEXT." + events.QueueStreamName(events.DefaultStream) + "." + events.ToolConsumer("calc")
	nextIn   = natsjwt.CoreAPIPrefix + ".CONSUMER.MSG.NEXT." + events.QueueStreamName(events.DefaultStream) + "." + events.ToolConsumer("calc")
)

// TestTenantPullFloodIsForgotten: a team cannot fill the core account's memory with the
// ways back of its pulls (issue 54). For every request with a reply that crosses into
// the core, nats-server keeps a response entry in the core account; a pull answered at
// once (no_wait: one 404) left it for the default threshold of 2 to 4 minutes, and
// nothing of the tenant's limits counts them (200,000 pulls: 200,000 entries, 66 MB).
// Every kind of generated credentials now gives the core's service exports a response
// threshold (accounts.ResponseThreshold by default, which the running server reports
// and a claims update of the core's JWT resets, the caveat the docs state; here a
// short one, the same rendering). With real team credentials, alpha floods its
// queue with 10,000 no_wait pulls: the core's pending responses rise over 200 (the
// probe works), then fall under 10 (the live pulls) once the threshold passed. The
// controls, with a threshold no legitimate stream stays silent for: a raw pull waits its
// whole expiry and hears its 408 with only heartbeats on the way; a pull older than
// twice the threshold, kept by its heartbeats, receives a call; and alpha's executor
// loop (teamqueue), pulling since before the flood, receives a call after the flood's
// entries are all gone. With nats-server's default threshold the flood's entries were
// still held at the deadline; with heartbeats slower than the threshold the long pull
// heard nothing, and a team executor's pull asked for heartbeats every 30 s.
func TestTenantPullFloodIsForgotten(t *testing.T) {
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}}}
	def, err := natsjwt.GenerateGrants(filepath.Join("..", "permissions.conf"), t.TempDir(), g, natsjwt.WithAccounts(), natsjwt.WithBcryptCost(bcrypt.MinCost))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range credKinds {
		opts, err := server.ProcessConfigFile(kind.conf(def))
		if err != nil {
			t.Fatal(err)
		}
		srv := eventstest.StartServer(t, opts)
		core, err := srv.LookupAccount(coreAccount(kind, def))
		if err != nil {
			t.Fatalf("%s: %v", kind.name, err)
		}
		for _, c := range accounts.TeamExports("alpha", []string{"calc"}) {
			if got, err := core.ServiceExportResponseThreshold(c.Subject); !c.Stream && (err != nil || got != accounts.ResponseThreshold) {
				t.Errorf("%s: the response threshold of the core's export of %s: %v %v, want %v", kind.name, c.Subject, got, err, accounts.ResponseThreshold)
			}
		}
		if kind.name == "jwt" {
			// The caveat the docs state (day two): a new JWT of the core account resets
			// the threshold to nats-server's default (accounts.go refuses to set it on an
			// account that has claims, and an update has the old ones) until a restart.
			ac, err := jwt.DecodeAccountClaims(def.AccountJWTs[def.Account])
			if err != nil {
				t.Fatal(err)
			}
			srv.UpdateAccountClaims(core, ac)
			if got, _ := core.ServiceExportResponseThreshold(coreNext); got != 2*time.Minute {
				t.Errorf("after a claims update the core's threshold is %v: nats-server keeps it now, drop the caveat of a core push in docs/deployment-and-security.md", got)
			}
		}
		srv.Shutdown()
	}
	const threshold = 3 * time.Second
	res, err := natsjwt.GenerateGrants(filepath.Join("..", "permissions.conf"), t.TempDir(), g, natsjwt.WithAccounts(),
		natsjwt.WithBcryptCost(bcrypt.MinCost), natsjwt.WithResponseThreshold(threshold))
	if err != nil {
		t.Fatal(err)
	}
	for i, kind := range credKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := eventstest.Context(t, 2*time.Minute)
			d := startAccounts(t, ctx, kind, res, "calc")
			core, err := d.srv.LookupAccount(coreAccount(kind, res))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := core.ServiceExportResponseThreshold(coreNext); err != nil || got != threshold {
				t.Fatalf("the response threshold of the core's export of %s: %v %v, want %v", coreNext, got, err, threshold)
			}
			alpha, _ := d.team("alpha")
			if i == 0 {
				executorPullsHeartbeatWithinTheGap(t, ctx, alpha)
				longPullsKeepTheirWay(t, d, alpha, threshold)
			}
			got := make(chan jetstream.Msg, 4)
			bus, err := events.Open(ctx, alpha, events.Config{APIPrefix: natsjwt.CoreAPIPrefix})
			if err != nil {
				t.Fatal(err)
			}
			cc, err := teamqueue.Open(bus, "calc", time.Minute).ConsumePulls(func(m jetstream.Msg) { _ = m.Ack(); got <- m }, 4, 4*threshold, threshold/6, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cc.Stop)
			const bound = 10
			peak := floodPulls(t, alpha, core, 10000)
			if peak <= 20*bound {
				t.Fatalf("the probe: alpha's flood left at most %d pending responses in the core", peak)
			}
			eventstest.Eventually(t, 20*threshold, func() error {
				if n := core.NumPendingResponses(""); n > bound {
					return fmt.Errorf("the core holds %d pending responses (peak %d), want at most %d", n, peak, bound)
				}
				return nil
			})
			t.Logf("%s: peak %d pending responses in the core, then at most %d", kind.name, peak, bound)
			callCalc(t, d, "after-the-flood")
			select {
			case m := <-got:
				if !strings.Contains(string(m.Data()), "after-the-flood") {
					t.Fatalf("control: alpha's executor received %q", m.Data())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("control: alpha's executor, pulling since before the flood, did not receive the call")
			}
		})
	}
}

// executorPullsHeartbeatWithinTheGap: a team executor's pulls (the consume loop asks
// teamqueue for pulls of two minutes with heartbeats every 30 s, its core queues'
// values) ask the server for heartbeats at most every events.TenantAnswerGap, so that
// they are never silent for the core's response threshold.
func executorPullsHeartbeatWithinTheGap(t *testing.T, ctx context.Context, nc *nats.Conn) {
	t.Helper()
	sent, err := nc.SubscribeSync(nextIn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sent.Unsubscribe() }()
	bus, err := events.Open(ctx, nc, events.Config{APIPrefix: natsjwt.CoreAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	q := teamqueue.Open(bus, "calc", time.Minute)
	for _, start := range []func() (jetstream.ConsumeContext, error){
		func() (jetstream.ConsumeContext, error) { return q.Consume(func(jetstream.Msg) {}) },
		func() (jetstream.ConsumeContext, error) {
			return q.ConsumePulls(func(jetstream.Msg) {}, 64, consume.PullExpiry, 30*time.Second, nil)
		},
	} {
		cc, err := start()
		if err != nil {
			t.Fatal(err)
		}
		m, err := sent.NextMsg(10 * time.Second)
		cc.Stop()
		if err != nil {
			t.Fatal(err)
		}
		var req struct {
			Heartbeat time.Duration `json:"idle_heartbeat"`
		}
		if err := json.Unmarshal(m.Data, &req); err != nil || req.Heartbeat <= 0 || req.Heartbeat > events.TenantAnswerGap {
			t.Errorf("an executor's pull of its team's queue asks heartbeats every %v (%s), want at most %v", req.Heartbeat, m.Data, events.TenantAnswerGap)
		}
	}
}

// callCalc requests a call of calc, as the core's admin.
func callCalc(t *testing.T, d *accountsDeployment, callID string) {
	t.Helper()
	bus, err := events.Open(d.ctx, d.conn("admin"), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tr := toolbus.ToolRequested{RunID: "r-" + callID, CallCount: 1, Call: toolbus.ToolCall{CallID: callID, Tool: "calc", Arguments: "{}"}}
	if _, err := bus.PublishEvent(d.ctx, events.ToolRequestedEvent("test", tr, true)); err != nil {
		t.Fatal(err)
	}
}

// coreAccount is the core account's name in kind: its public key in the JWT kind.
func coreAccount(kind credKind, res natsjwt.Result) string {
	if kind.name == "jwt" {
		return res.Account
	}
	return natsjwt.CoreAccount
}

// floodPulls sends n no_wait pulls of calc's queue on nc, each with its own reply under
// one subscription, and returns the most pending responses the core held meanwhile.
func floodPulls(t *testing.T, nc *nats.Conn, core *server.Account, n int) int {
	t.Helper()
	var answered atomic.Int64
	sub, err := nc.Subscribe("flood.>", func(*nats.Msg) { answered.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	_ = sub.SetPendingLimits(-1, -1)
	peak := 0
	for i := range n {
		if err := nc.PublishRequest(nextIn, fmt.Sprintf("flood.%d", i), []byte(`{"batch":1,"no_wait":true}`)); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 {
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			peak = max(peak, core.NumPendingResponses(""))
		}
	}
	return max(peak, core.NumPendingResponses(""))
}

// longPullsKeepTheirWay: a pull of alpha's queue that lasts longer than threshold keeps
// its way back through the core while the server's heartbeats (a third of it) go
// through it: one waits its whole expiry (three thresholds) and hears its 408, and one
// that heard heartbeats for more than twice the threshold receives a call.
func longPullsKeepTheirWay(t *testing.T, d *accountsDeployment, nc *nats.Conn, threshold time.Duration) {
	t.Helper()
	pull := func(expires time.Duration) *nats.Subscription {
		sub, err := nc.SubscribeSync(nats.NewInbox())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		req := fmt.Sprintf(`{"batch":1,"expires":%d,"idle_heartbeat":%d}`, expires.Nanoseconds(), (threshold / 3).Nanoseconds())
		if err := nc.PublishRequest(nextIn, sub.Subject, []byte(req)); err != nil {
			t.Fatal(err)
		}
		return sub
	}
	next := func(sub *nats.Subscription) *nats.Msg {
		m, err := sub.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("control: a long pull heard nothing: %v", err)
		}
		return m
	}
	whole, beats := pull(3*threshold), 0
	for m := next(whole); m.Header.Get("Status") != "408"; m = next(whole) {
		if m.Header.Get("Status") != "100" {
			t.Fatalf("control: the pull that waits its whole expiry got %q %v", m.Data, m.Header)
		}
		beats++
	}
	_ = whole.Unsubscribe()
	called := pull(time.Minute)
	for beats = 0; beats < 7; beats++ {
		if m := next(called); m.Header.Get("Status") != "100" {
			t.Fatalf("control: the pull waiting for a call got %q %v", m.Data, m.Header)
		}
	}
	callCalc(t, d, "to-a-long-pull")
	m := next(called)
	for ; !strings.Contains(string(m.Data), "to-a-long-pull"); m = next(called) {
		if m.Header.Get("Status") != "100" {
			t.Fatalf("control: a pull older than twice the threshold got %q %v instead of the call", m.Data, m.Header)
		}
	}
	if err := nc.Publish(m.Reply, []byte("+ACK")); err != nil {
		t.Fatal(err)
	}
	_ = called.Unsubscribe()
}
