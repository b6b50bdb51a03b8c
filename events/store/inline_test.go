package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
)

func result(call, content string) toolbus.ToolResult {
	return toolbus.ToolResult{CallID: call, Tool: "t", Status: toolbus.StatusSucceeded, Content: content,
		Output: json.RawMessage(`{"big":"output the stream keeps"}`)}
}

// historyKey reads a key of the history bucket directly; found false when absent.
func historyKey(t *testing.T, ctx context.Context, bus *events.Bus, key string) (jetstream.KeyValueEntry, bool) {
	t.Helper()
	kv, err := bus.JetStream().KeyValue(ctx, store.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return e, true
}

// countReads counts the direct-get requests sent to the history bucket while f runs.
func countReads(t *testing.T, bus *events.Bus, f func()) int {
	t.Helper()
	nc := bus.Conn()
	sub, err := nc.SubscribeSync("$JS.API.DIRECT.GET.KV_" + store.BucketHistory + ".>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	sub2, err := nc.SubscribeSync("$JS.API.DIRECT.GET.KV_" + store.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	f()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range []*nats.Subscription{sub, sub2} {
		for {
			if _, err := s.NextMsg(300 * time.Millisecond); err != nil {
				break
			}
			n++
		}
	}
	return n
}

// A result that fits the inline budget is written in the join state with its mark and
// nowhere else: the readers (Step, Result, the planner's PlanView) find it there, the
// step costs one read, the plan view one request, and no key of its own is written.
// Output is never kept.
func TestInlineResults(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	const run = "inl"
	calls := []toolbus.ToolCall{{CallID: "a", Tool: "t"}, {CallID: "b", Tool: "t"}, {CallID: "c", Tool: "t"}}
	if _, _, err := bus.Store().PutAssistant(ctx, toolbus.ModelResponded{RunID: run, Step: 0,
		Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}}); err != nil {
		t.Fatal(err)
	}
	st := store.NewStepState(run, 0, 3)
	budget := bus.Store().InlineBudget()
	for i, c := range calls {
		if joined, full := st.JoinInline(i, store.EncodeResult(result(c.CallID, "out "+c.CallID)), budget); !joined || full {
			t.Fatalf("join %d: joined %v full %v", i, joined, full)
		}
	}
	// A second result for a call changes nothing: the first stands.
	if joined, full := st.JoinInline(1, store.EncodeResult(result("b", "other")), budget); joined || full {
		t.Fatalf("duplicate: joined %v full %v", joined, full)
	}
	if _, err := bus.Store().PutStepState(ctx, st, 0); err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		if _, found := historyKey(t, ctx, bus, run+".0.r."+string(rune('0'+i))); found {
			t.Errorf("result %d has a key of its own", i)
		}
		r, err := bus.Store().Result(ctx, run, 0, i)
		if err != nil || r.Content != "out "+c.CallID || r.Output != nil {
			t.Errorf("Result %d = %+v, %v", i, r, err)
		}
	}
	var rec *store.StepRecord
	if n := countReads(t, bus, func() {
		var err error
		if rec, _, err = bus.Store().Step(ctx, run, 0); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Errorf("Step sent %d reads, want 1 (the join state holds the results)", n)
	}
	if !rec.Complete() {
		t.Fatalf("step %+v not complete", rec)
	}
	for i, r := range rec.Results {
		if r.Content != "out "+calls[i].CallID || r.Output != nil {
			t.Errorf("step result %d = %+v", i, r)
		}
	}
	var v store.PlanView
	if n := countReads(t, bus, func() {
		var err error
		if v, err = bus.Store().PlanView(ctx, run, 1); err != nil {
			t.Fatal(err)
		}
		if rec, err = bus.Store().AssemblePlanView(ctx, v); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Errorf("PlanView and AssemblePlanView sent %d reads, want 1", n)
	}
	for i, r := range rec.Results {
		if r == nil || r.Content != "out "+calls[i].CallID {
			t.Errorf("plan view result %d = %+v", i, r)
		}
	}
	msgs, err := bus.Store().StepMessages(ctx, run, 0)
	if err != nil || len(msgs) != 4 || msgs[3].Content != "out c" {
		t.Errorf("StepMessages = %+v, %v", msgs, err)
	}
}

// The inline budget: a result larger than InlineResultMax, or one that would take the
// inline results of the state past the budget, is not joined inline (full: it goes under
// its own key first); the encoded state stays within the budget plus its bit sets.
func TestInlineBudget(t *testing.T) {
	const n = 200
	st := store.NewStepState("bud", 0, n)
	big := store.EncodeResult(result("big", strings.Repeat("x", store.InlineResultMax)))
	if joined, full := st.JoinInline(0, big, store.InlineStateMax); joined || !full || st.Received.Has(0) {
		t.Fatalf("a result over InlineResultMax: joined %v full %v", joined, full)
	}
	one := store.EncodeResult(result("c", strings.Repeat("y", 3000)))
	inline := 0
	for i := 1; i < n; i++ {
		joined, full := st.JoinInline(i, one, store.InlineStateMax)
		if joined == full {
			t.Fatalf("call %d: joined %v full %v", i, joined, full)
		}
		if full {
			if st.Received.Has(i) {
				t.Fatalf("call %d marked without its result", i)
			}
			st.Received.Set(i) // as after its own key is written
			continue
		}
		inline++
	}
	if want := store.InlineStateMax / (len(one) + 8); inline < want || inline > store.InlineStateMax/len(one) {
		t.Errorf("%d results inline, want about %d", inline, want)
	}
	if st.InlineBytes() > store.InlineStateMax || st.Overflowed() != n-1-inline {
		t.Errorf("inline bytes %d (budget %d), overflowed %d", st.InlineBytes(), store.InlineStateMax, st.Overflowed())
	}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if bits := 2 * 4 * ((n/8 + 2) / 3); len(raw) > store.InlineStateMax+bits+200 {
		t.Errorf("encoded state %d bytes, more than the budget %d and its bit sets", len(raw), store.InlineStateMax)
	}
}

// On a server whose max_payload is small, the inline budget is a quarter of it, so the
// join state always fits in a message.
func TestInlineBudgetFollowsMaxPayload(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir(), MaxPayload: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bus, _, err := provision.Setup(eventstest.Context(t, time.Minute), nc, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := bus.Store().InlineBudget(); got != 16<<10 {
		t.Errorf("inline budget %d with max_payload 64 KiB, want %d", got, 16<<10)
	}
	if got := openBus(t).Store().InlineBudget(); got != store.InlineStateMax {
		t.Errorf("inline budget %d with the default max_payload, want %d", got, store.InlineStateMax)
	}
}

// A step joined before results were inlined (the join state's bit sets only, every
// result under its own key, as the previous release wrote them) reads as before, and a
// result joined inline later into the same step reads beside them: runs in flight
// across an upgrade keep working.
func TestOldLayoutStep(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	const run = "old"
	calls := []toolbus.ToolCall{{CallID: "a", Tool: "t"}, {CallID: "b", Tool: "t"}, {CallID: "c", Tool: "t"}, {CallID: "d", Tool: "t"}}
	if _, _, err := bus.Store().PutAssistant(ctx, toolbus.ModelResponded{RunID: run, Step: 0,
		Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}}); err != nil {
		t.Fatal(err)
	}
	for i, c := range []string{"a", "b"} {
		if _, _, err := bus.Store().PutResult(ctx, run, 0, i, result(c, "old "+c)); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := bus.JetStream().KeyValue(ctx, store.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	// The previous release's encoding of a join state of 4 calls, 0 and 1 received,
	// 3 waiting: {"received":[3],"waiting":[8]} as base64.
	rev, err := kv.Create(ctx, run+".0.s", []byte(`{"run_id":"old","step":0,"call_count":4,"received":"Aw==","waiting":"CA=="}`))
	if err != nil {
		t.Fatal(err)
	}
	check := func(rec *store.StepRecord, want map[int]string) {
		t.Helper()
		for i := 0; i < 4; i++ {
			r := rec.Results[i]
			switch w, ok := want[i]; {
			case ok && (r == nil || r.Content != w):
				t.Errorf("result %d = %+v, want %q", i, r, w)
			case !ok && r != nil:
				t.Errorf("result %d = %+v, want none", i, r)
			}
		}
	}
	rec, got, err := bus.Store().Step(ctx, run, 0)
	if err != nil || got != rev {
		t.Fatalf("Step: %v (revision %d, want %d)", err, got, rev)
	}
	check(rec, map[int]string{0: "old a", 1: "old b"})
	if rec.Waiting[3] == nil || rec.Waiting[3].CallID != "d" {
		t.Errorf("waiting call 3: %+v", rec.Waiting)
	}
	if r, err := bus.Store().Result(ctx, run, 0, 1); err != nil || r.Content != "old b" {
		t.Errorf("Result 1 = %+v, %v", r, err)
	}
	if _, err := bus.Store().Result(ctx, run, 0, 2); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Result of an unanswered call: %v, want ErrNotFound", err)
	}

	// The new release joins call 2 inline into the old step.
	st, rev, err := bus.Store().StepState(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Waiting.Has(3) || st.Overflowed() != 2 {
		t.Fatalf("decoded old state %+v", st)
	}
	if joined, _ := st.JoinInline(2, store.EncodeResult(result("c", "new c")), bus.Store().InlineBudget()); !joined {
		t.Fatal("call 2 not joined")
	}
	if _, err := bus.Store().PutStepState(ctx, st, rev); err != nil {
		t.Fatal(err)
	}
	want := map[int]string{0: "old a", 1: "old b", 2: "new c"}
	if rec, _, err = bus.Store().Step(ctx, run, 0); err != nil {
		t.Fatal(err)
	}
	check(rec, want)
	v, err := bus.Store().PlanView(ctx, run, 1)
	if err != nil || v.Prev == nil || len(v.Results) != 2 {
		t.Fatalf("PlanView: %+v, %v (want the 2 results under their own keys read with it)", v, err)
	}
	if rec, err = bus.Store().AssemblePlanView(ctx, v); err != nil {
		t.Fatal(err)
	}
	check(rec, want)
	for i, w := range want {
		if r, err := bus.Store().ResultOf(ctx, st, i); err != nil || r.Content != w {
			t.Errorf("ResultOf %d = %+v, %v", i, r, err)
		}
	}
}

// A join state whose inline results name a call it does not mark received is refused
// as malformed: an inline result is only ever written with its mark.
func TestInlineResultWithoutMarkIsMalformed(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	kv, err := bus.JetStream().KeyValue(ctx, store.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "bad.0.s", []byte(`{"run_id":"bad","step":0,"call_count":2,"received":"AQ==","results":{"1":{"call_id":"b"}}}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := bus.Store().StepState(ctx, "bad", 0); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("StepState of a state with an unmarked inline result: %v, want malformed", err)
	}
}
