package console

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// TestConsoleOnAClientAccount: the console runs on a client account's credentials
// bound to the identities of its users (the accounts layout: its own connection, no
// core credential) and reads through the core's read service as each signed-in user:
// alice lists her run and not bob's or carol's, reads her run's call and the tools
// offered, and bob's run is refused to her; a user whose identity the account is not
// bound to (carol) gets 403. CONTROL: bob reads his run on the same console, and carol
// hers on a console of her own account.
func TestConsoleOnAClientAccount(t *testing.T) {
	srv := intaketest.StartTenants(t, nil, map[string][]string{"console": {"alice", "bob"}, "carol": {"carol"}})
	connect := func(user string) *nats.Conn { return eventstest.Connect(t, srv, user) }
	script := func() *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(toolbus.ToolCall{CallID: "c1", Tool: "calculator", Arguments: `{"expression":"6*7"}`}),
			planner.Answer("forty-two")}}
	}
	p := startPipelineOn(t, connect("core"), map[string]*planner.Script{"alice-1": script(), "bob-1": script(), "carol-1": script()})
	p.Roles.Go("reads", reads.New(p.Bus, p.Log).Serve)
	p.WaitTools("calculator")
	for _, who := range []string{"alice", "bob", "carol"} {
		p.SubmitAs(who+"-1", who, "what is 6*7?", toolbus.Limits{})
	}
	for _, who := range []string{"alice", "bob", "carol"} {
		p.WaitStatus(who+"-1", toolbus.RunCompleted)
	}
	tokens := map[string]string{"alice": door.NewToken(), "bob": door.NewToken(), "carol": door.NewToken()}
	serve := func(user, id string, names ...string) string {
		t.Helper()
		var bus *events.Bus
		eventstest.Eventually(t, 30*time.Second, func() error {
			var err error
			bus, err = events.Open(p.ctx, connect(user), events.Config{ReadPrefix: events.ReadAPIPrefix(id)})
			return err
		})
		var lines []string
		for _, n := range names {
			lines = append(lines, door.Entry(n, tokens[n], nil))
		}
		src, err := door.NewSource(strings.Join(lines, "; "), "")
		if err != nil {
			t.Fatal(err)
		}
		h, err := New(p.ctx, bus, Options{Users: src, Instance: "console-test"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatalf("the console on %s's client account: %v", user, err)
		}
		hs := httptest.NewServer(h)
		t.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })
		return hs.URL
	}
	shared := serve("console", "alice", "alice", "bob", "carol")
	own := serve("carol", "carol", "carol")

	for _, tc := range []struct {
		name, url, who, path string
		code                 int
		has, hasNot          []string
	}{
		{"alice lists her runs", shared, "alice", "/", http.StatusOK, []string{"alice-1"}, []string{"bob-1", "carol-1"}},
		{"alice reads her run", shared, "alice", "/runs/alice-1", http.StatusOK, []string{"calculator", "6*7"}, nil},
		{"alice reads the tools offered", shared, "alice", "/tools", http.StatusOK, []string{"calculator"}, nil},
		{"alice reads bob's run", shared, "alice", "/runs/bob-1", 0, nil, []string{"6*7"}},
		{"CONTROL: bob reads his run", shared, "bob", "/runs/bob-1", http.StatusOK, []string{"calculator", "6*7"}, nil},
		{"carol, not bound, on the shared console", shared, "carol", "/runs/carol-1", http.StatusForbidden, []string{"not bound"}, []string{"6*7"}},
		{"CONTROL: carol reads her run on her own console", own, "carol", "/runs/carol-1", http.StatusOK, []string{"calculator", "6*7"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, tc.url+tc.path, tokens[tc.who])
			if tc.code != 0 && code != tc.code || tc.code == 0 && code == http.StatusOK {
				t.Fatalf("GET %s as %s: %d, want %d:\n%s", tc.path, tc.who, code, tc.code, body)
			}
			for _, s := range tc.has {
				if !strings.Contains(body, s) {
					t.Errorf("GET %s as %s does not show %q", tc.path, tc.who, s)
				}
			}
			for _, s := range tc.hasNot {
				if strings.Contains(body, s) {
					t.Errorf("GET %s as %s shows %q", tc.path, tc.who, s)
				}
			}
		})
	}
}
