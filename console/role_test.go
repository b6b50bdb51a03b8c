package console

import (
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/planner"
)

// TestConsoleClientRole: the console works with the credentials it ships with, the
// client role of deploy/nats (auth-users.conf, permissions.conf as they are): every
// page (the runs list with its filters, a run, its raw events, the tools page with the
// queues) is served, the server reports no permission violation, and no page creates
// a consumer (the client may not create any on the stream: it reads with direct gets
// and, for the queues, consumer info).
func TestConsoleClientRole(t *testing.T) {
	pw := map[string]string{}
	for _, role := range []string{"admin", "planner", "executor", "injector", "client"} {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		pw[role] = fmt.Sprintf("%x", b)
		t.Setenv("TOOLBUS_"+strings.ToUpper(role)+"_PASSWORD", pw[role])
	}
	opts, err := natsserver.ProcessConfigFile(filepath.Join("..", "deploy", "nats", "auth-users.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort = "127.0.0.1", -1, "", 0
	opts.StoreDir, opts.NoLog, opts.NoSigs = t.TempDir(), true, true
	ns, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	// The workers run as admin here: this test is about the console's role.
	admin, err := nats.Connect(ns.ClientURL(), nats.UserInfo("admin", pw["admin"]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	p := startPipelineOn(t, admin, map[string]*planner.Script{
		"r-done": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("n", "noop", `{}`)), planner.Answer("done"),
		}},
		"r-wait": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("d", "deploy", `{"service":"api"}`)), planner.Answer("deployed"),
		}},
	}, deployTool())
	p.submit("r-done", toolbus.Limits{})
	p.submit("r-wait", toolbus.Limits{})
	p.WaitStatus("r-done", toolbus.RunCompleted)
	p.WaitStatus("r-wait", toolbus.RunWaitingForApproval)

	var mu sync.Mutex
	var violations []string
	client, err := nats.Connect(ns.ClientURL(), nats.UserInfo("client", pw["client"]),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	bus, err := events.Open(p.ctx, client, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(p.ctx, bus, Options{PublicRead: true, Instance: "role-test"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })

	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		info, err := js.AccountInfo(p.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.Consumers
	}
	before := consumers()
	eventstest.Eventually(t, 30*time.Second, func() error {
		code, body := get(t, srv.URL+"/readyz", "")
		if code != 200 {
			return fmt.Errorf("readyz %d: %s", code, body)
		}
		return nil
	})
	pages := []struct{ path, want string }{
		{"/", `id="run-r-wait"`},
		{"/?tool=deploy&principal=tester&since=1h&q=r-", `id="run-r-wait"`},
		{"/runs/r-done", `id="run-steps">2<`},
		{"/runs/r-wait", `data-status="waiting"`},
		{"/runs/r-done/events", `class="text cloudevent"`},
		{"/runs/r-done/events.json", `"cloudevent"`},
		{"/tools", `<td class="inflight">0</td>`},
		{"/tools", `data-state="waiting for approval"`},
	}
	for _, pg := range pages {
		code, body := get(t, srv.URL+pg.path, "")
		if code != 200 || !strings.Contains(body, pg.want) {
			t.Fatalf("GET %s as the client role: %d, want 200 with %s:\n%s", pg.path, code, pg.want, body)
		}
		if strings.Contains(body, "queue-err") {
			t.Fatalf("GET %s: a queue could not be read:\n%s", pg.path, body)
		}
	}
	if after := consumers(); after != before {
		t.Fatalf("%d consumers after the pages, %d before", after, before)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("permission violations of the client role: %q", violations)
	}
}
