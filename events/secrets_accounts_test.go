package events_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
)

// TestTeamAccountSecrets: with the exports of the accounts layout for the secrets
// (docs/tenancy-design.md; per team: $KV.toolbus_secrets.<team>.> and the direct gets
// of $KV.toolbus_secrets.<team>.> under JS.core.API), a team's executor writes and reads
// its own keys with compare-and-set from its account, and reaches no other team's:
// beta's token stays unread and unchanged.
func TestTeamAccountSecrets(t *testing.T) {
	const pre = "JS.core.API"
	var exports []string
	imports := map[string][]string{}
	for _, team := range []string{"alpha", "beta"} {
		for _, e := range []struct{ subject, local string }{
			{"$KV." + store.BucketSecrets + "." + team + ".>", ""},
			{"$JS.API.DIRECT.GET.KV_" + store.BucketSecrets + ".$KV." + store.BucketSecrets + "." + team + ".>",
				pre + ".DIRECT.GET.KV_" + store.BucketSecrets + ".$KV." + store.BucketSecrets + "." + team + ".>"},
		} {
			exports = append(exports, fmt.Sprintf(`{service: %q, accounts: [%s]}`, e.subject, team))
			to := ""
			if e.local != "" {
				to = fmt.Sprintf(", to: %q", e.local)
			}
			imports[team] = append(imports[team], fmt.Sprintf(`{service: {account: CORE, subject: %q}%s}`, e.subject, to))
		}
	}
	dir := t.TempDir()
	conf := fmt.Sprintf(`listen: 127.0.0.1:-1
jetstream { store_dir: %q }
accounts {
  CORE { jetstream: enabled, users: [{user: core, password: core}], exports: [
    %s
  ] }
  alpha { users: [{user: alpha, password: alpha}], imports: [
    %s
  ] }
  beta { users: [{user: beta, password: beta}], imports: [
    %s
  ] }
}
`, filepath.Join(dir, "js"), strings.Join(exports, "\n    "), strings.Join(imports["alpha"], "\n    "), strings.Join(imports["beta"], "\n    "))
	path := filepath.Join(dir, "accounts.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := eventstest.StartServer(t, opts)
	ctx := eventstest.Context(t, time.Minute)
	connect := func(user string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	core, _, err := provision.Setup(ctx, connect("core"), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	coreBeta, err := core.Secrets(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := coreBeta.Swap(ctx, "tok", []byte("beta-token"), 0); err != nil || !ok {
		t.Fatalf("the core writes beta's secret: %v %v", ok, err)
	}

	alphaBus, err := events.Open(ctx, connect("alpha"), events.Config{APIPrefix: pre})
	if err != nil {
		t.Fatal(err)
	}
	alpha, err := alphaBus.Secrets(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	rev, ok, err := alpha.Swap(ctx, "tok", []byte("alpha-1"), 0)
	if err != nil || !ok {
		t.Fatalf("alpha creates its secret: %v %v", ok, err)
	}
	if _, ok, err := alpha.Swap(ctx, "tok", []byte("alpha-x"), 0); err != nil || ok {
		t.Fatalf("alpha's second create: swapped %v, %v (want lost)", ok, err)
	}
	if _, ok, err := alpha.Swap(ctx, "tok", []byte("alpha-2"), rev); err != nil || !ok {
		t.Fatalf("alpha updates on its revision: %v %v", ok, err)
	}
	if v, _, err := alpha.Load(ctx, "tok"); err != nil || string(v) != "alpha-2" {
		t.Fatalf("alpha reads its secret: %q, %v", v, err)
	}

	stolen, err := alphaBus.Secrets(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	if v, _, err := stolen.Load(ctx, "tok"); err == nil {
		t.Fatalf("alpha read beta's secret: %q", v)
	}
	if _, ok, err := stolen.Swap(ctx, "tok", []byte("alpha-was-here"), 0); err == nil || ok {
		t.Fatalf("alpha wrote beta's secret: swapped %v, %v", ok, err)
	}
	if v, _, err := coreBeta.Load(ctx, "tok"); err != nil || string(v) != "beta-token" {
		t.Fatalf("beta's secret: %q, %v (want it unchanged)", v, err)
	}
}
