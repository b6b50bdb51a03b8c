package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// TestTenantRefusalsSayWhatToUse: every client command a tenant runs with its own
// credentials in the accounts layout (team alpha's executor user, client alice bound to
// alice) either works or exits 1 with one line saying what these credentials can do and
// what to use instead, never the server's words ("JetStream not enabled for account",
// "no responders", "is an injector running?"). CONTROL: alice's credentials with her
// own read prefix list her runs and the tools.
func TestTenantRefusalsSayWhatToUse(t *testing.T) {
	srv := intaketest.StartTenants(t, map[string][]string{"alpha": {"calculator"}}, map[string][]string{"alice": {"alice"}})
	noModel := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		return planner.Response{}, planner.Permanent(context.Canceled)
	})
	tp := testpipe.StartOn(t, eventstest.Connect(t, srv, "core"), 3*time.Minute, noModel)
	tp.Roles.Go("reads", reads.New(tp.Bus, tp.Log).Serve)
	tp.WaitTools("calculator")
	t.Setenv("TOOLBUS_NATS_URL", srv.ClientURL())
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	as := func(user string, env ...string) []string {
		return append([]string{"TOOLBUS_NATS_USER=" + user, "TOOLBUS_NATS_PASSWORD=" + user}, env...)
	}
	const (
		team     = "these are a team's executor credentials (TOOLBUS_NATS_API_PREFIX): they serve the team's own tools"
		noStream = "these credentials are a team's or a client's account, which holds no stream"
		notBound = "nothing answers the read service of identity bob: these client credentials read only as the identities their account is bound to"
	)
	teamPrefix := as("alpha", "TOOLBUS_NATS_API_PREFIX=JS.core.API")
	otherID := as("alice", "TOOLBUS_NATS_READ_PREFIX="+events.ReadAPIPrefix("bob"))
	console := []string{"TOOLBUS_CONSOLE_ADDR=127.0.0.1:0", "TOOLBUS_CONSOLE_PUBLIC_READ=true"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"team: replay", teamPrefix, []string{"replay", "r1"}, 1, team},
		{"team: runs", teamPrefix, []string{"runs"}, 1, team},
		{"team: tail", teamPrefix, []string{"tail", "r1"}, 1, team},
		{"team: tools", teamPrefix, []string{"tools"}, 1, team},
		{"team: call", teamPrefix, []string{"call", "calculator", `{"expression":"1+1"}`}, 1, team},
		{"team: approve", teamPrefix, []string{"approve", "r1", "c1"}, 1, team},
		{"team: mcp", teamPrefix, []string{"mcp"}, 1, team},
		{"team: console", append(teamPrefix, console...), []string{"console"}, 1, team},
		{"client: console", append(as("alice", "TOOLBUS_NATS_READ_PREFIX="+events.ReadAPIPrefix("alice")), console...), []string{"console"}, 1, "on a client account's credentials (TOOLBUS_NATS_READ_PREFIX) each user reads and acts as their own identity"},
		{"team, no prefix: replay", as("alpha"), []string{"replay", "r1"}, 1, noStream},
		{"team, no prefix: runs", as("alpha"), []string{"runs"}, 1, noStream},
		{"client, no prefix: runs", as("alice"), []string{"runs"}, 1, noStream},
		{"client, no prefix: replay", as("alice"), []string{"replay", "r1"}, 1, noStream},
		{"client as another identity: runs", otherID, []string{"runs"}, 1, notBound},
		{"client as another identity: replay", otherID, []string{"replay", "r1"}, 1, notBound},
		{"client as another identity: tools", otherID, []string{"tools"}, 1, notBound},
		{"CONTROL: client as its identity: runs", as("alice", "TOOLBUS_NATS_READ_PREFIX="+events.ReadAPIPrefix("alice")), []string{"runs"}, 0, ""},
		{"CONTROL: client as its identity: tools", as("alice", "TOOLBUS_NATS_READ_PREFIX="+events.ReadAPIPrefix("alice")), []string{"tools"}, 0, "calculator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, kv := range []string{"TOOLBUS_NATS_API_PREFIX=", "TOOLBUS_NATS_READ_PREFIX=", "TOOLBUS_CONSOLE_ADDR=", "TOOLBUS_CONSOLE_PUBLIC_READ="} {
				t.Setenv(strings.TrimSuffix(kv, "="), "") // restored when the case ends
				os.Unsetenv(strings.TrimSuffix(kv, "="))
			}
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(tp.Ctx, time.Minute)
			defer cancel()
			var out, errOut bytes.Buffer
			code := run(ctx, tc.args, &out, &errOut)
			text := out.String() + errOut.String()
			if code != tc.code || !strings.Contains(text, tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, text)
			}
			if tc.code == 0 {
				return
			}
			if lines := strings.Split(strings.TrimSpace(errOut.String()), "\n"); len(lines) != 1 {
				t.Errorf("the refusal is %d lines, want one:\n%s", len(lines), errOut.String())
			}
			for _, raw := range []string{"JetStream not enabled", "no responders", "is an injector running", "API error"} {
				if strings.Contains(text, raw) {
					t.Errorf("the refusal says the server's %q:\n%s", raw, text)
				}
			}
		})
	}
}
