package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
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
)

// TestTeamWritesRefusedTyped: every write of a team in its own account passes the
// core's write service, and each one it refuses returns the typed error, with the
// service's reason kept: the store's KV writes (claims, outputs, instances, catalog,
// secrets; put, create, compare-and-set, delete) and the event publishes (synchronous
// and asynchronous) over the team's bytes per second wrap events.ErrTenantQuota (which
// passes later); a roll-up wraps events.ErrWriteRefused (for good).
func TestTeamWritesRefusedTyped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "accounts.conf")
	if err := os.WriteFile(path, []byte(eventstest.TenantsConf(filepath.Join(dir, "js"), map[string][]string{"alpha": {"calc"}}, nil)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := eventstest.StartServer(t, opts)
	// One byte a second: once the team's burst is spent it stays spent for the test.
	intaketest.ServeIntake(t, eventstest.Connect(t, srv, "core"), intake.Limits{BytesPerSecond: 1, Burst: 16 << 10})
	ctx := eventstest.Context(t, time.Minute)
	if _, _, err := provision.Setup(ctx, eventstest.Connect(t, srv, "core"), events.Config{}, provision.WithTools([]string{"calc"}, 0, 0)); err != nil {
		t.Fatal(err)
	}
	alpha := eventstest.Connect(t, srv, "alpha")
	team, err := events.Open(ctx, alpha, events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	st := team.Store()
	secrets, err := team.Secrets(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	claim := store.Claim{Team: "alpha", Instance: "alpha-1", Boot: "b", Attempt: 1, At: time.Now().UTC()}
	// Before the budget is spent, the team's writes pass (the control).
	var rev uint64
	eventstest.Eventually(t, 10*time.Second, func() error { // the service subscribes
		var err error
		_, rev, err = st.ClaimCall(ctx, "calc", "r1", 0, "c0", claim)
		return err
	})
	if _, _, err := secrets.Swap(ctx, "mcp", []byte("token"), 0); err != nil {
		t.Fatal(err)
	}
	spend(ctx, t, alpha, events.SubjectToolLog("spend", "calc"))

	log := events.ToolLogEvent("/test", toolbus.ToolLog{RunID: "r1", CallID: "c0", Tool: "calc", Attempt: 1, Seq: 1, Level: "info", Message: "line"})
	for _, w := range []struct {
		what  string
		write func() error
	}{
		{"claim (create)", func() error { _, _, err := st.ClaimCall(ctx, "calc", "r1", 0, "c1", claim); return err }},
		{"claim take-over (compare-and-set)", func() error { _, err := st.TakeOverClaim(ctx, "calc", "r1", 0, "c0", claim, rev); return err }},
		{"claim release (delete)", func() error { return st.ReleaseClaim(ctx, "calc", "r1", 0, "c0") }},
		{"output chunk (put)", func() error { _, err := st.PutOutput(ctx, "calc", "r1", 0, "c0", []byte("output")); return err }},
		{"instance record", func() error {
			_, err := st.PutInstance(ctx, store.Instance{Team: "alpha", Name: "alpha-1", Boot: "b", Tools: []string{"calc"}})
			return err
		}},
		{"catalog entry", func() error {
			return st.PublishTool(ctx, toolbus.ToolContract{Name: "calc", Owner: "alpha", Description: "adds", InputSchema: json.RawMessage(`{"type":"object"}`)}, false)
		}},
		{"secret", func() error { _, _, err := secrets.Swap(ctx, "mcp", []byte("token2"), 0); return err }},
		{"event", func() error { _, err := team.PublishEvent(ctx, log); return err }},
		{"event (async)", func() error {
			f, err := team.PublishEventAsync(ctx, log)
			if err != nil {
				return err
			}
			return events.AwaitAcks(ctx, []*events.PubFuture{f})
		}},
	} {
		err := w.write()
		if !errors.Is(err, events.ErrTenantQuota) || !events.WritePassesLater(err) || events.WriteRefusedForGood(err) ||
			!strings.Contains(err.Error(), "TOOLBUS_TENANT_BYTES_PER_SECOND") {
			t.Errorf("%s over the quota: %v, want events.ErrTenantQuota with the service's reason", w.what, err)
		}
	}

	js, err := jetstream.New(alpha)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(events.SubjectToolLog("r1", "calc"))
	m.Header.Set("Nats-Rollup", "sub")
	_, err = js.PublishMsg(ctx, m)
	if err = events.WriteRefusal(err); !errors.Is(err, events.ErrWriteRefused) || !events.WriteRefusedForGood(err) ||
		events.WritePassesLater(err) || !strings.Contains(err.Error(), "roll-up") {
		t.Errorf("a roll-up: %v, want events.ErrWriteRefused for good with the service's reason", err)
	}
}

// spend spends the team's budget at the write service with writes on subject from nc (a
// connection of the team's account), halving each refused write down to one byte: the
// team is then left less than one byte.
func spend(ctx context.Context, t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	for size := 8192; size >= 1; {
		r, err := nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subject, Data: []byte(strings.Repeat("s", size))})
		if err != nil {
			t.Fatalf("spend: %v", err)
		}
		if strings.Contains(string(r.Data), `"error"`) {
			size /= 2
		}
	}
}
