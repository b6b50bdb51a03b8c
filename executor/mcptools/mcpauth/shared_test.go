package mcpauth_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// TestSharedTokenRenewedOnceForAllInstances: two executor instances on one bus (each
// its own connection) serve the tool of an MCP server behind OAuth (client
// credentials) whose tokens live 2 s and are refused once expired; the instances renew
// 500 ms early. One run calls the tool twice per step, through both instances (one call
// at a time each), in three steps, waiting between steps until the last token issued
// has expired: the token expires mid-run. The run completes; the token endpoint issued
// the first token and then one per expiry for the whole deployment: no token was taken
// while the deployment's last one was still fresh (without sharing, each instance takes
// its own, moments apart). The tokens are in toolbus_secrets and nowhere else: not in
// the stream, another bucket or the logs.
func TestSharedTokenRenewedOnceForAllInstances(t *testing.T) {
	const clientID, secret = "toolbus-replicas", "cs-shared-secret-8a7b6c5d"
	const ttl, early = 2 * time.Second, 500 * time.Millisecond
	as := newAuthServer(t, clientID, secret, ttl)
	url := protectedServer(t, as.URL, as.live)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := mcptools.Config{MCPServers: map[string]mcptools.Server{"secure": {URL: url,
		OAuth: &mcpauth.Config{Grant: mcpauth.GrantClientCredentials, ClientID: clientID, ClientSecret: secret}}}}
	roles := testutil.NewGroup(t, ctx)
	instances := []string{"exec-1", "exec-2"}
	for _, name := range instances {
		nc, _ := srv.Connect(t)
		ebus := testutil.Must(events.Open(ctx, nc, events.Config{}))
		sec, err := ebus.Secrets(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		reg := executor.NewRegistry()
		ex := testutil.Must(executor.New(reg, executor.WithLogger(log), executor.WithInstance(name)))
		p := testutil.Must(mcptools.New(reg, cfg, mcptools.Options{Logger: ex.Logger(), OnSecret: ex.AddSecrets,
			Tokens: sec, RefreshEarly: early}))
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		// One call at a time: the two calls of a step go one to each instance.
		roles.Go(name, testutil.Must(worker.New(ebus, ex, worker.Config{WorkerConfig: workerconfig.WorkerConfig{
			Instance: name, Logger: ex.Logger(), Grace: time.Second, Concurrency: 1}})).Run)
	}
	cat, err := bus.Store().WatchCatalog(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		if _, ok := cat.Lookup("secure__leak"); !ok {
			return errors.New("secure__leak not in the catalog yet")
		}
		return nil
	})

	// expired waits until the last token issued has expired (the server refuses it).
	expired := func() {
		eventstest.Eventually(t, 30*time.Second, func() error {
			at := as.issuedAt()
			if len(at) == 0 || time.Since(at[len(at)-1]) <= ttl {
				return errors.New("the last token has not expired yet")
			}
			return nil
		})
	}
	step := func(n int, wait bool) func(planner.Request) planner.Response {
		calls := planner.Calls(toolbus.ToolCall{CallID: fmt.Sprintf("s%d-a", n), Tool: "secure__leak", Arguments: `{}`},
			toolbus.ToolCall{CallID: fmt.Sprintf("s%d-b", n), Tool: "secure__leak", Arguments: `{}`})
		return func(r planner.Request) planner.Response {
			if wait {
				expired()
			}
			return calls(r)
		}
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{step(0, false), step(1, true), step(2, true), planner.Answer("done")}}
	wc := func(name string) workerconfig.WorkerConfig {
		return workerconfig.WorkerConfig{Instance: name, Logger: log, Grace: time.Second}
	}
	evs := completeRun(t, ctx, roles, bus, cat, model, wc, "shared-run")

	// Every call succeeded (a token the server refused would fail it), redacted, and
	// after the expiries both instances served calls.
	results, served := 0, map[string]bool{}
	for _, e := range evs {
		if e.Meta.Type != events.TypeToolFinished {
			continue
		}
		results++
		if !strings.Contains(string(e.Data), `succeeded`) || !strings.Contains(string(e.Data), "[REDACTED]") {
			t.Errorf("a call did not succeed with its token redacted: %s", e.Data)
		}
		if !strings.Contains(string(e.Data), `"s0-`) {
			served[e.Meta.Source] = true
		}
	}
	if results != 6 {
		t.Errorf("%d tool results, want 6", results)
	}
	for _, name := range instances {
		if !served[events.Source("executor", name)] {
			t.Fatalf("instance %s served no call after an expiry (served: %v): the test proves nothing of sharing", name, served)
		}
	}

	at := as.issuedAt()
	t.Logf("token requests: %d (one initial and one per expiry: 3)", len(at))
	if len(at) < 3 {
		t.Errorf("%d tokens issued: the token that expired before steps 1 and 2 was not renewed", len(at))
	}
	for i := 1; i < len(at); i++ {
		// A token is renewed once the deployment's last one is due: ttl - early after
		// it was issued at the earliest (less a margin for the clock readings).
		if gap := at[i].Sub(at[i-1]); gap < ttl-early-100*time.Millisecond {
			t.Errorf("token %d was taken %v after token %d, while that one was fresh: an instance renewed on its own (not shared)", i+1, gap, i)
		}
	}

	tokens, _ := as.tokens()
	shared := storedText(ctx, t, srv.JS, "KV_"+store.BucketSecrets)
	if !strings.Contains(storedText(ctx, t, srv.JS), tokens[len(tokens)-1]) {
		t.Errorf("the last token is not in %s: it was not shared through the bucket", store.BucketSecrets)
	}
	everywhere := shared + "\n" + logs.String()
	for _, c := range append([]string{secret}, tokens...) {
		if strings.Contains(everywhere, c) {
			t.Errorf("credential %.6s... is in the stream, a bucket other than %s, or the logs", c, store.BucketSecrets)
		}
	}
	if !strings.Contains(logs.String(), "MCP server connected") {
		t.Fatalf("the logs were not captured: %s", logs.String())
	}
}

// TestSharedLoginRefreshedOnceByTwoInstances: the token file of an operator's login
// seeds the token two executor instances share; the authorization server rotates
// refresh tokens (each works once) and its access tokens live 2 s. Both instances call
// the tool, then again after each expiry, at once: every call succeeds (an instance
// that refreshed with a refresh token the other had used would be refused, and fail
// for want of a login), one refresh per expiry serves both, and the token file is left
// as the login wrote it.
func TestSharedLoginRefreshedOnceByTwoInstances(t *testing.T) {
	const ttl, early = 2 * time.Second, 500 * time.Millisecond
	as := newCodeServer(t, ttl)
	as.strict = true
	url := protectedServer(t, as.URL, as.valid)
	cfg := mcpauth.Config{RedirectURL: "http://" + freeLoopback(t) + "/callback", TokenFile: filepath.Join(t.TempDir(), "tokens.json")}
	ctx := eventstest.Context(t, time.Minute)
	login(ctx, t, url, cfg)
	seed, err := os.ReadFile(cfg.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	// The login's own refreshes (its token lives less than its RefreshEarly) are not
	// the instances'.
	as.mu.Lock()
	atLogin := len(as.refreshAt)
	as.mu.Unlock()

	srv := eventstest.RunJetStream(t)
	if _, _, err := provision.Setup(ctx, srv.Conn, events.Config{}); err != nil {
		t.Fatal(err)
	}
	var tools []executor.Tool
	for range 2 {
		nc, _ := srv.Connect(t)
		sec, err := testutil.Must(events.Open(ctx, nc, events.Config{})).Secrets(ctx, "team-a")
		if err != nil {
			t.Fatal(err)
		}
		reg := executor.NewRegistry()
		ex := testutil.Must(executor.New(reg))
		p := testutil.Must(mcptools.New(reg, mcptools.Config{MCPServers: map[string]mcptools.Server{"s": {URL: url, OAuth: &cfg}}},
			mcptools.Options{OnSecret: ex.AddSecrets, Tokens: sec, RefreshEarly: early}))
		if err := p.Start(ctx); err != nil {
			t.Fatalf("an instance did not connect with the login's token: %v", err)
		}
		t.Cleanup(p.Close)
		tool, ok := reg.Lookup("s__leak")
		if !ok {
			t.Fatalf("tools: %v", reg.Names())
		}
		tools = append(tools, tool)
	}
	callBoth := func() {
		errs := make(chan error, len(tools))
		for _, tool := range tools {
			go func() {
				_, err := tool.Func(ctx, []byte(`{}`))
				errs <- err
			}()
		}
		for range tools {
			if err := <-errs; err != nil {
				t.Fatalf("a call failed: %v", err)
			}
		}
	}
	expired := func() {
		eventstest.Eventually(t, 30*time.Second, func() error {
			as.mu.Lock()
			defer as.mu.Unlock()
			var last time.Time
			for _, at := range as.issued {
				if at.After(last) {
					last = at
				}
			}
			if time.Since(last) <= ttl {
				return errors.New("the last access token has not expired yet")
			}
			return nil
		})
	}
	callBoth()
	for range 2 {
		expired()
		callBoth()
	}

	as.mu.Lock()
	at := append([]time.Time(nil), as.refreshAt[atLogin:]...)
	as.mu.Unlock()
	if len(at) < 2 {
		t.Errorf("%d refreshes: the token that expired before the calls was not refreshed", len(at))
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < ttl-early-100*time.Millisecond {
			t.Errorf("refresh %d came %v after refresh %d, while its token was fresh: an instance refreshed on its own", i+1, gap, i)
		}
	}
	if now, _ := os.ReadFile(cfg.TokenFile); string(now) != string(seed) {
		t.Errorf("an executor rewrote the login's token file (the shared token lives in %s)", store.BucketSecrets)
	}
}
