package injector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// The calls of a step from its model.responded event (calls.go): a step whose event the
// injector heard is joined without reading its assistant message; one it did not hear
// is read; an event whose body disagrees with its subject or id is never cached; and on
// a server configured with the shipped role permissions, no role but the planner can
// put calls into the cache.

// cachedCalls returns the calls cached for a step.
func cachedCalls(in *Injector, run string, step int) ([]toolbus.ToolCall, bool) {
	in.calls.mu.Lock()
	defer in.calls.mu.Unlock()
	e, ok := in.calls.lookup(stepID(run, step))
	return e.calls, ok
}

// responded is the model.responded of a step of calls c0..c<n-1> of tool t.
func responded(run string, step, n int) toolbus.ModelResponded {
	calls := make([]toolbus.ToolCall, n)
	for i := range calls {
		calls[i] = toolbus.ToolCall{CallID: fmt.Sprintf("c%d", i), Tool: "t", Arguments: `{"x":1}`}
	}
	return toolbus.ModelResponded{RunID: run, Step: step, Model: "m",
		Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}}
}

// assistantReads counts the direct gets of the assistant messages of run (key
// <run>.<step>.a of the history bucket) that reach the server.
func assistantReads(t *testing.T, nc *nats.Conn, run string) func() int {
	t.Helper()
	return eventstest.Counter(t, nc, "$JS.API.DIRECT.GET.KV_"+store.BucketHistory+".$KV."+store.BucketHistory+"."+run+".*.a")
}

// TestStepJoinedFromHeardCalls: an injector (running, on its own connection) joins a
// step whose model.responded it heard without a single read of the step's assistant
// message, and still refuses a result that is not the step's call; a step whose event
// it never heard is read (once) and joined all the same.
func TestStepJoinedFromHeardCalls(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	tb := eventstest.RunJetStream(t)
	bus, _, err := provision.Setup(ctx, tb.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	inConn, _ := tb.Connect(t)
	inBus, err := events.Open(ctx, inConn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	in := joinInjector(t, inBus, "calls")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	seen, unseen := "heard-run", "unheard-run"
	seenReads, unseenReads := assistantReads(t, tb.Conn, seen), assistantReads(t, tb.Conn, unseen)
	const n = 3
	for _, run := range []string{seen, unseen} {
		if err := bus.StartRun(ctx, events.Source("test", "t"), toolbus.RunStarted{RunID: run, Model: "m",
			Principal: toolbus.Principal{ID: "p"}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "x"}}}); err != nil {
			t.Fatal(err)
		}
		eventstest.Eventually(t, time.Minute, func() error {
			_, err := runlog.LastModelRequest(ctx, bus, run)
			return err
		})
		// What the planner does: record the answer, then publish it.
		if _, _, err := bus.Store().PutAssistant(ctx, responded(run, 0, n)); err != nil {
			t.Fatal(err)
		}
	}
	// The injector subscribes as it starts: publish until it heard the event (the
	// stream keeps one; a subscriber hears each publish).
	eventstest.Eventually(t, time.Minute, func() error {
		if _, err := bus.PublishEvent(ctx, events.ModelRespondedEvent("/test", responded(seen, 0, n))); err != nil {
			return err
		}
		if calls, ok := cachedCalls(in, seen, 0); !ok || len(calls) != n || calls[1].CallID != "c1" || calls[1].Arguments != "" {
			return fmt.Errorf("calls of %s step 0 not heard (ids only): %+v", seen, calls)
		}
		return nil
	})

	// A result that is not the step's call is still refused, from the heard calls.
	bad := finished(seen, 0, 1, n, "forged")
	bad.ToolResult.CallID = "c9"
	if err := in.Finished(ctx, bad); !errors.Is(err, events.ErrPoison) {
		t.Fatalf("a result for a call the model did not make: %v, want poison", err)
	}
	for _, run := range []string{seen, unseen} {
		for i := 0; i < n; i++ {
			if _, err := bus.PublishEvent(ctx, events.ToolFinishedEvent("/test", finished(run, 0, i, n, fmt.Sprintf("r%d", i)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, run := range []string{seen, unseen} {
		eventstest.Eventually(t, time.Minute, func() error {
			if step, err := runlog.LastModelRequest(ctx, bus, run); err != nil || step != 1 {
				return fmt.Errorf("run %s: model.requested of step %d (%v), want step 1 after the join", run, step, err)
			}
			return nil
		})
		rec, _, err := bus.Store().Step(ctx, run, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rec.Results {
			if r == nil || r.Content != fmt.Sprintf("r%d", i) {
				t.Fatalf("run %s: result %d = %+v", run, i, r)
			}
		}
	}
	if got := seenReads(); got != 0 {
		t.Errorf("the injector read the assistant message of a step it heard %d times, want 0", got)
	}
	if got := unseenReads(); got < 1 {
		t.Errorf("the injector read the assistant message of a step it did not hear %d times, want at least 1 (else this test cannot see reads)", got)
	}
	if _, ok := cachedCalls(in, seen, 0); ok {
		t.Errorf("the calls of a joined step are still cached")
	}
}

// TestForgedRespondedNotCached: model.responded events whose body names another run
// than their subject, whose id names another step than their body, of another type, or
// not CloudEvents at all, are ignored; a genuine one published after them is cached.
func TestForgedRespondedNotCached(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "forged")
	stop, err := in.followCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	nc := bus.Conn()
	publish := func(subject string, m events.Meta, data any) {
		t.Helper()
		msg, err := events.Encode(subject, m, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	meta := func(run string, step int) events.Meta {
		return events.Meta{ID: events.IDModelResponded(run, step), Type: events.TypeModelResponded, Source: "/evil", RunID: run, Step: step}
	}
	victim := events.SubjectModelResponded("victim")
	// The body names another run than the subject (with the attribute of either).
	publish(victim, meta("victim", 0), responded("other", 0, 1))
	publish(victim, meta("other", 0), responded("other", 0, 1))
	// The id names step 0, the body step 3.
	publish(victim, meta("victim", 0), responded("victim", 3, 1))
	// Another event type on the subject.
	publish(victim, events.Meta{ID: "victim/0/model.requested", Type: events.TypeModelRequested, Source: "/evil", RunID: "victim"},
		toolbus.ModelRequested{RunID: "victim", Step: 0})
	// Not a CloudEvent.
	if err := nc.Publish(victim, []byte(`{"run_id":"victim","step":0,"message":{"tool_calls":[{"call_id":"x","tool":"t"}]}}`)); err != nil {
		t.Fatal(err)
	}
	// Then a genuine one: the subscription handles messages in order, so once it is
	// cached every message above was handled.
	publish(events.SubjectModelResponded("sentinel"), meta("sentinel", 0), responded("sentinel", 0, 2))
	eventstest.Eventually(t, 30*time.Second, func() error {
		if calls, ok := cachedCalls(in, "sentinel", 0); !ok || len(calls) != 2 {
			return fmt.Errorf("genuine event not cached: %+v", calls)
		}
		return nil
	})
	for _, s := range []struct {
		run  string
		step int
	}{{"victim", 0}, {"victim", 3}, {"other", 0}} {
		if calls, ok := cachedCalls(in, s.run, s.step); ok {
			t.Errorf("a forged event put calls of %s step %d in the cache: %+v", s.run, s.step, calls)
		}
	}
}

// TestCallCacheBounded: the cache holds at most two generations; a step in use survives
// the turnover, and a heard entry with the same calls keeps the arguments a read found.
func TestCallCacheBounded(t *testing.T) {
	c := newCallCache()
	ctx := context.Background()
	read := func() ([]toolbus.ToolCall, error) {
		return []toolbus.ToolCall{{CallID: "c0", Tool: "t", Arguments: "{}"}}, nil
	}
	if _, err := c.get(ctx, "hot", true, read); err != nil {
		t.Fatal(err)
	}
	c.heard("hot", []toolbus.ToolCall{{CallID: "c0", Tool: "t", Arguments: "{}"}})
	for i := 0; i < 5*callGeneration; i++ {
		c.heard(fmt.Sprintf("run-%d.0", i), []toolbus.ToolCall{{CallID: "c0", Tool: "t"}})
		if i%(callGeneration/2) == 0 {
			calls, err := c.get(ctx, "hot", true, func() ([]toolbus.ToolCall, error) { return nil, errors.New("read again") })
			if err != nil || calls[0].Arguments != "{}" {
				t.Fatalf("the step in use was dropped or lost its arguments: %+v, %v", calls, err)
			}
		}
	}
	if got := c.len(); got > 2*callGeneration {
		t.Fatalf("%d entries cached, bound %d", got, 2*callGeneration)
	}
	c.forget("hot")
	if _, err := c.get(ctx, "hot", false, func() ([]toolbus.ToolCall, error) { return nil, store.ErrNotFound }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a forgotten step was not read again: %v", err)
	}
}

// startShipped starts a server from the shipped deploy/nats/auth-users.conf (the role
// permissions of permissions.conf) with a random password per role, and returns its URL
// and the passwords.
func startShipped(t *testing.T) (string, map[string]string) {
	t.Helper()
	pw := map[string]string{}
	for _, role := range []string{"admin", "planner", "executor", "injector", "client"} {
		pw[role] = fmt.Sprintf("pw-%s-%d", role, time.Now().UnixNano())
		t.Setenv("TOOLBUS_"+strings.ToUpper(role)+"_PASSWORD", pw[role])
	}
	opts, err := server.ProcessConfigFile(filepath.Join("..", "deploy", "nats", "auth-users.conf"))
	if err != nil {
		t.Fatal(err)
	}
	return eventstest.StartServer(t, opts).ClientURL(), pw
}

// refusals records the permission violations the server reports to each connection.
type refusals struct {
	mu   sync.Mutex
	list []string
}

func (r *refusals) has(role, subject string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.list {
		if strings.HasPrefix(s, role+": ") && strings.Contains(s, `"`+subject+`"`) {
			return true
		}
	}
	return false
}

func connectRole(t *testing.T, url, role, password string, r *refusals) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(role, password), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				r.mu.Lock()
				r.list = append(r.list, role+": "+err.Error())
				r.mu.Unlock()
			}
		}))
	if err != nil {
		t.Fatalf("%s connects: %v", role, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestOnlyThePlannerFeedsTheCallCache: on a server with the shipped role permissions,
// the injector may follow model.responded; the executor, the client and the injector
// itself, with their legitimate credentials, publish a well-formed model.responded for a
// step: the server refuses each, and the injector caches nothing for that step. The
// planner's event is cached.
func TestOnlyThePlannerFeedsTheCallCache(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	url, pw := startShipped(t)
	r := &refusals{}
	if _, _, err := provision.Setup(ctx, connectRole(t, url, "admin", pw["admin"], r), events.Config{}); err != nil {
		t.Fatalf("admin sets the bus up: %v", err)
	}
	inBus, err := events.Open(ctx, connectRole(t, url, "injector", pw["injector"], r), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	in := joinInjector(t, inBus, "shipped")
	stop, err := in.followCalls(ctx)
	if err != nil {
		t.Fatalf("the injector role may not follow model.responded: %v", err)
	}
	defer stop()

	subject := events.SubjectModelResponded("poison")
	forged := responded("poison", 0, 1)
	forged.Message.ToolCalls[0] = toolbus.ToolCall{CallID: "evil", Tool: "t"}
	msg, err := events.Encode(subject, events.Meta{ID: events.IDModelResponded("poison", 0), Type: events.TypeModelResponded,
		Source: "/evil", RunID: "poison"}, forged)
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"executor", "client", "injector"} {
		nc := connectRole(t, url, role, pw[role], r)
		if role == "injector" {
			nc = inBus.Conn()
		}
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		eventstest.Eventually(t, 10*time.Second, func() error {
			if !r.has(role, subject) {
				return fmt.Errorf("the server did not refuse %s's model.responded", role)
			}
			return nil
		})
	}
	planner := connectRole(t, url, "planner", pw["planner"], r)
	genuine, err := events.Encode(events.SubjectModelResponded("genuine"), events.Meta{ID: events.IDModelResponded("genuine", 0),
		Type: events.TypeModelResponded, Source: "/planner", RunID: "genuine"}, responded("genuine", 0, 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := planner.PublishMsg(genuine); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		if calls, ok := cachedCalls(in, "genuine", 0); !ok || len(calls) != 2 {
			return fmt.Errorf("the planner's model.responded not cached: %+v", calls)
		}
		return nil
	})
	if calls, ok := cachedCalls(in, "poison", 0); ok {
		t.Fatalf("a non-planner role put calls in the cache: %+v", calls)
	}
}

// TestCallSubscriptionRefused: where the injector's credentials predate the
// model.responded subscription, followCalls reports ErrNoCallSubscription and the
// injector reads the step's calls as before.
func TestCallSubscriptionRefused(t *testing.T) {
	ctx := eventstest.Context(t, time.Minute)
	all := &server.SubjectPermission{Allow: []string{">"}}
	url := eventstest.StartServer(t, &server.Options{JetStream: true, Users: []*server.User{
		{Username: "admin", Password: "a", Permissions: &server.Permissions{Publish: all, Subscribe: all}},
		{Username: "injector", Password: "i", Permissions: &server.Permissions{Publish: all,
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>", "toolbus.*.run.completed"}}}},
	}}).ClientURL()
	r := &refusals{}
	bus, _, err := provision.Setup(ctx, connectRole(t, url, "admin", "a", r), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	inBus, err := events.Open(ctx, connectRole(t, url, "injector", "i", r), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	in, err := New(inBus, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "old", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.followCalls(ctx); !errors.Is(err, ErrNoCallSubscription) {
		t.Fatalf("followCalls on refused credentials: %v, want ErrNoCallSubscription", err)
	}
	recordCalls(t, ctx, bus, "old-run", 0, 2)
	calls, err := in.stepCalls(ctx, "old-run", 0)
	if err != nil || len(calls) != 2 || calls[1].CallID != "c1" {
		t.Fatalf("calls read without the subscription: %+v, %v", calls, err)
	}
}
