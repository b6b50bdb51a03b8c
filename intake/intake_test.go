package intake_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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
	"github.com/toolbus/toolbus/telemetry"
)

// answer is what a write gets back: the stream's pub ack or the intake's refusal.
type answer struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Error     *struct {
		Code    int    `json:"code"`
		ErrCode int    `json:"err_code"`
		Desc    string `json:"description"`
	} `json:"error"`
}

// write publishes data on subject from nc (with a roll-up header when rollup is not
// empty) and returns the answer.
func write(t *testing.T, ctx context.Context, nc *nats.Conn, subject, data, rollup string) answer {
	t.Helper()
	if rollup != "" {
		return send(t, ctx, nc, subject, data, "Nats-Rollup", rollup)
	}
	return send(t, ctx, nc, subject, data)
}

// TestTenantsCannotRollUpOthersKeys: every bucket a team writes allows roll-ups (a KV
// purge is one), and a roll-up of the whole stream purges every key in it. Team beta,
// on its own key of each bucket, with its generated layout's imports, asks for one: the
// intake refuses it, alpha's key is still there, and beta's own plain write (the
// control) is stored. Without the intake's check, each of alpha's keys is gone.
func TestTenantsCannotRollUpOthersKeys(t *testing.T) {
	srv := intaketest.StartTenants(t, map[string][]string{"alpha": {"calc"}, "beta": {"search"}}, nil)
	ctx := eventstest.Context(t, time.Minute)
	core := provisionedCore(t, ctx, srv)
	js, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	alpha, beta := eventstest.Connect(t, srv, "alpha"), eventstest.Connect(t, srv, "beta")
	for _, tc := range []struct{ bucket, alphaKey, betaKey string }{
		{store.BucketClaims, "calc.r1.0.c1", "search.r1.0.c1"},
		{store.BucketTools, "calc", "search"},
		{store.BucketOutputs, "calc.r1.0.c1.0", "search.r1.0.c1.0"},
		{store.BucketInstances, "alpha.i1.b1", "beta.i1.b1"},
		{store.BucketSecrets, "alpha.s1", "beta.s1"},
	} {
		t.Run(tc.bucket, func(t *testing.T) {
			kv, err := js.KeyValue(ctx, tc.bucket)
			if err != nil {
				t.Fatal(err)
			}
			if a := write(t, ctx, alpha, "$KV."+tc.bucket+"."+tc.alphaKey, "alpha's", ""); a.Error != nil || a.Seq == 0 {
				t.Fatalf("alpha's own key, through the intake: %+v", a)
			}
			a := write(t, ctx, beta, "$KV."+tc.bucket+"."+tc.betaKey, "beta's", "all")
			if a.Error == nil || a.Error.Code != 400 || a.Error.ErrCode != events.WriteRefusedErrCode || !strings.Contains(a.Error.Desc, "roll-up") {
				t.Errorf("beta's roll-up of the bucket is not refused: %+v", a)
			}
			if e, err := kv.Get(ctx, tc.alphaKey); err != nil || string(e.Value()) != "alpha's" {
				t.Errorf("alpha's key after beta's roll-up: %v", err)
			}
			if a := write(t, ctx, beta, "$KV."+tc.bucket+"."+tc.betaKey, "beta's", ""); a.Error != nil {
				t.Fatalf("beta's own plain write: %+v", a)
			}
			if e, err := kv.Get(ctx, tc.betaKey); err != nil || string(e.Value()) != "beta's" {
				t.Errorf("beta's own key: %v", err)
			}
		})
	}
}

// TestIntakeRefusesOtherForms: what the intake forwards is only a tenant's own writes,
// checked again behind the imports (a core user could publish on the write service's
// subjects directly).
func TestIntakeRefusesOtherForms(t *testing.T) {
	srv := intaketest.StartTenants(t, nil, nil)
	ctx := eventstest.Context(t, time.Minute)
	core := eventstest.Connect(t, srv, "core")
	if _, _, err := provision.Setup(ctx, core, events.Config{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		subject string
		refused bool
	}{
		{events.ClientWriteSubject("bob", events.SubjectRunStarted("r1", "bob")), false},
		{events.ClientWriteSubject("bob", events.SubjectRunStarted("r2", "alice")), true},
		{events.ClientWriteSubject("bob", events.SubjectRunEnded("r3", toolbus.RunCompleted)), true},
		{events.ClientWriteSubject("bob", events.SubjectToolFinished("r4", "calc")), true},
		{events.ClientWriteSubject("bob", "$KV."+store.BucketRuns+".r5"), true},
		{events.TeamWriteSubject("beta", events.SubjectToolFinished("r6", "search")), false},
		{events.TeamWriteSubject("beta", events.SubjectRunEnded("r7", toolbus.RunCompleted)), true},
		{events.TeamWriteSubject("beta", events.SubjectRunStarted("r8", "alice")), true},
		{events.TeamWriteSubject("beta", "$KV."+store.BucketRuns+".r9"), true},
		{events.TeamWriteSubject("beta", "$KV."+store.BucketHistory+".r10"), true},
		{events.WriteServicePrefix + ".admin.x." + events.SubjectRunEnded("r11", toolbus.RunCompleted), true},
	} {
		a := write(t, ctx, core, tc.subject, `{}`, "")
		if refused := a.Error != nil; refused != tc.refused || refused && (a.Error.Code != 400 || a.Error.ErrCode != events.WriteRefusedErrCode) {
			t.Errorf("%s: refused %v, want %v: %+v", tc.subject, refused, tc.refused, a)
		}
	}
}

// TestTenantBytesAreBounded: client bob floods the store; the intake refuses his start
// over TOOLBUS_MAX_START_BYTES at the door (nothing stored) and, past his bytes per
// second, every further write at once with ErrTenantQuota, while alice's start is
// stored. What bob got stored is within his burst and his rate over the flood's time.
// A team over its rate is refused the same way, and another team is not.
func TestTenantBytesAreBounded(t *testing.T) {
	lim := intake.Limits{BytesPerSecond: 20_000, Burst: 100_000, MaxStartBytes: 64 << 10}
	srv := intaketest.StartTenantsLimited(t, map[string][]string{"alpha": {"calc"}, "beta": {"search"}},
		map[string][]string{"alice": {"alice"}, "bob": {"bob"}}, lim)
	ctx := eventstest.Context(t, time.Minute)
	core := eventstest.Connect(t, srv, "core")
	coreBus, _, err := provision.Setup(ctx, core, events.Config{}, provision.WithTools([]string{"calc", "search"}, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = reads.New(coreBus, nil).Serve(rctx) }()
	client := func(id string) *events.Bus {
		var bus *events.Bus
		eventstest.Eventually(t, 30*time.Second, func() error {
			var err error
			bus, err = events.Open(ctx, eventstest.Connect(t, srv, id), events.Config{ReadPrefix: events.ReadAPIPrefix(id)})
			return err
		})
		return bus
	}
	alice, bob := client("alice"), client("bob")
	start := func(bus *events.Bus, id, run string, pad int) error {
		return bus.StartRun(ctx, "test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: id},
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: strings.Repeat("x", pad)}}})
	}
	stream, err := jetstream.New(core)
	if err != nil {
		t.Fatal(err)
	}
	js, err := stream.Stream(ctx, events.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	stored := func(run, id string) bool {
		_, err := js.GetLastMsgForSubject(ctx, events.SubjectRunStarted(run, id))
		return err == nil
	}

	if err := start(bob, "bob", "bob-huge", 900<<10); !errors.Is(err, events.ErrWriteRefused) {
		t.Errorf("bob's 900 KiB start: %v, want ErrWriteRefused", err)
	}
	if stored("bob-huge", "bob") {
		t.Error("bob's 900 KiB start is stored")
	}
	began, n, size := time.Now(), 0, 10_000
	var quota error
	for i := range 100 {
		if err := start(bob, "bob", fmt.Sprintf("bob-%d", i), size); err != nil {
			quota = err
			break
		}
		n++
	}
	if !errors.Is(quota, events.ErrTenantQuota) {
		t.Fatalf("bob's flood of %d starts: %v, want ErrTenantQuota", n, quota)
	}
	if most := (float64(lim.Burst) + lim.BytesPerSecond*time.Since(began).Seconds()) / float64(size); float64(n) > most+1 {
		t.Errorf("bob got %d starts of %d bytes stored, over his burst and rate (%.0f)", n, size, most)
	}
	if err := start(alice, "alice", "alice-1", 1000); err != nil || !stored("alice-1", "alice") {
		t.Errorf("alice's start beside bob's flood: %v", err)
	}

	alpha, beta := eventstest.Connect(t, srv, "alpha"), eventstest.Connect(t, srv, "beta")
	var refused *answer
	for i := range 100 {
		a := write(t, ctx, alpha, events.SubjectToolLog(fmt.Sprintf("r%d", i), "calc"), strings.Repeat("y", size), "")
		if a.Error != nil {
			refused = &a
			break
		}
	}
	if refused == nil || refused.Error.Code != 429 || refused.Error.ErrCode != events.WriteQuotaErrCode {
		t.Errorf("alpha's flood of logs is not refused quota_exceeded: %+v", refused)
	}
	if a := write(t, ctx, beta, events.SubjectToolLog("r1", "search"), "beta's", ""); a.Error != nil || a.Seq == 0 {
		t.Errorf("beta's log beside alpha's flood: %+v", a)
	}
	// One write over the whole burst could never pass: refused for good (400), not over
	// quota (429), so that no executor retries it.
	if a := write(t, ctx, beta, events.SubjectToolLog("r2", "search"), strings.Repeat("z", lim.Burst+1), ""); a.Error == nil ||
		a.Error.Code != 400 || a.Error.ErrCode != events.WriteRefusedErrCode || !strings.Contains(a.Error.Desc, "burst") {
		t.Errorf("beta's write over its burst: %+v, want refused 400", a.Error)
	}
}

// TestRefusalsAreCounted: the injector's /metrics counts each refused write by tenant
// and code (telemetry's collector, as the injector role wires it), and no admitted one.
func TestRefusalsAreCounted(t *testing.T) {
	srv := eventstest.StartTenantsBare(t, map[string][]string{"beta": {"search"}}, nil)
	ctx := eventstest.Context(t, time.Minute)
	core := eventstest.Connect(t, srv, "core")
	if _, _, err := provision.Setup(ctx, core, events.Config{}); err != nil {
		t.Fatal(err)
	}
	tel := telemetry.New(telemetry.RoleInjector)
	svc := intake.New(core, intake.Limits{}, nil)
	svc.Observe(tel)
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Serve(sctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	beta := eventstest.Connect(t, srv, "beta")
	eventstest.Eventually(t, 10*time.Second, func() error { // the service subscribes
		if a := write(t, ctx, beta, events.SubjectToolLog("r1", "search"), "ok", ""); a.Error != nil {
			return fmt.Errorf("%+v", a)
		}
		return nil
	})
	for range 2 {
		write(t, ctx, beta, "$KV."+store.BucketClaims+".search.r1.c1", "x", "all")
	}
	if got := counted(t, tel, telemetry.MetricWritesRefused, map[string]string{"tenant": "team.beta", "code": "400"}); got != 2 {
		t.Errorf("%s{tenant=team.beta,code=400} = %v, want 2", telemetry.MetricWritesRefused, got)
	}
	if admitted, refused := svc.Counts(); admitted < 1 || refused != 2 {
		t.Errorf("counts: %d admitted, %d refused", admitted, refused)
	}
}

// counted is the value of the series of metric name with labels in tel's registry (0
// when it is not there).
func counted(t *testing.T, tel *telemetry.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := tel.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// provisionedCore connects as the core account of srv and provisions the stream and the
// buckets with the tools calc and search, as the intake tests' deployments have them.
func provisionedCore(t *testing.T, ctx context.Context, srv *server.Server) *nats.Conn {
	t.Helper()
	core := eventstest.Connect(t, srv, "core")
	if _, _, err := provision.Setup(ctx, core, events.Config{}, provision.WithTools([]string{"calc", "search"}, 0, 0)); err != nil {
		t.Fatal(err)
	}
	return core
}
