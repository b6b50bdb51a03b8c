package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// The planner plans a step without reading its view (the batched get on the history
// bucket) only on a first delivery whose carried results answer the calls it recorded
// itself; everything else reads the view as before. The tests drive the planner's
// handler with real deliveries from a real server, stand in for the injector (they join
// the results and publish model.requested) and count the direct gets on the history
// bucket.

// viewEnv is a server with an admin bus (the test) and the planners' bus on a
// connection of its own.
type viewEnv struct {
	t       *testing.T
	ctx     context.Context
	srv     *eventstest.Bus
	admin   *events.Bus
	pbus    *events.Bus
	batched *nats.Subscription // batched direct gets on the history bucket
	byKey   *nats.Subscription // direct gets of one key
	model   *viewModel
}

// Calls of step 0 (an error result, a large one under its own key, a rejected unknown
// tool) and of step 1.
var (
	viewCalls0 = []toolbus.ToolCall{
		{CallID: "c0", Tool: "lookup", Arguments: `{}`},
		{CallID: "c1", Tool: "big", Arguments: `{}`},
		{CallID: "c2", Tool: "nope", Arguments: `{}`},
	}
	viewCalls1 = []toolbus.ToolCall{{CallID: "c3", Tool: "lookup", Arguments: `{"again":true}`}}
)

func newViewEnv(t *testing.T) *viewEnv {
	t.Helper()
	ctx := eventstest.Context(t, 2*time.Minute)
	srv := eventstest.RunJetStream(t)
	admin, _, err := provision.Setup(ctx, srv.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := srv.Connect(t)
	pbus, err := events.Open(ctx, nc, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e := &viewEnv{t: t, ctx: ctx, srv: srv, admin: admin, pbus: pbus, model: &viewModel{script: []func(Request) (Response, error){
		answerCalls(viewCalls0), answerCalls(viewCalls1), answerText("done"),
	}}}
	if e.batched, err = srv.Conn.SubscribeSync("$JS.API.DIRECT.GET.KV_" + store.BucketHistory); err != nil {
		t.Fatal(err)
	}
	if e.byKey, err = srv.Conn.SubscribeSync("$JS.API.DIRECT.GET.KV_" + store.BucketHistory + ".>"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	return e
}

func answerCalls(calls []toolbus.ToolCall) func(Request) (Response, error) {
	return func(Request) (Response, error) {
		return Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: append([]toolbus.ToolCall(nil), calls...)}}, nil
	}
}

func answerText(s string) func(Request) (Response, error) {
	return func(Request) (Response, error) {
		return Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: s}}, nil
	}
}

// planner returns a new planner on the planners' bus (its own cache).
func (e *viewEnv) planner(name string) *Planner {
	e.t.Helper()
	cat, err := e.pbus.Store().WatchCatalog(e.ctx, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	p, err := New(e.pbus, e.model, cat, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: name,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// historyGets returns the direct gets on the history bucket since the last call. The
// requests counted were routed to the subscriptions before their answers reached the
// planner, so one round trip on the subscriber's connection has them all delivered.
func (e *viewEnv) historyGets() (batched, byKey int) {
	e.t.Helper()
	if err := e.srv.Conn.Flush(); err != nil {
		e.t.Fatal(err)
	}
	count := func(sub *nats.Subscription) int {
		n, _, err := sub.Pending()
		if err != nil {
			e.t.Fatal(err)
		}
		for range n {
			if _, err := sub.NextMsg(time.Second); err != nil {
				e.t.Fatal(err)
			}
		}
		return n
	}
	return count(e.batched), count(e.byKey)
}

// start starts run (its run.started and running state, as the client and the injector
// write them).
func (e *viewEnv) start(run string) {
	e.t.Helper()
	if err := e.admin.StartRun(e.ctx, "/test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: "tester"},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "question of " + run}}}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.admin.Store().CreateRunState(e.ctx, run, time.Now()); err != nil {
		e.t.Fatal(err)
	}
}

// request publishes a model.requested for step of run (with a unique event id, so that
// every request is stored) and returns its first delivery.
func (e *viewEnv) request(id string, mr toolbus.ModelRequested) jetstream.Msg {
	e.t.Helper()
	ev := events.ModelRequestedEvent("/test", mr)
	ev.Meta.ID = id
	if _, err := e.admin.Publish(e.ctx, ev.Subject, ev.Meta, ev.Data); err != nil {
		e.t.Fatal(err)
	}
	return e.next(id, ev.Subject, 1)
}

// next returns the next delivery of the message with id on subject, which must be its
// delivered-th.
func (e *viewEnv) next(id, subject string, delivered uint64) jetstream.Msg {
	e.t.Helper()
	cons, err := e.admin.EventStream().CreateOrUpdateConsumer(e.ctx, jetstream.ConsumerConfig{
		Durable: "test-" + strings.ReplaceAll(id, "/", "-"), FilterSubject: subject,
		DeliverPolicy: jetstream.DeliverLastPolicy, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	md, err := msg.Metadata()
	if err != nil {
		e.t.Fatal(err)
	}
	if md.NumDelivered != delivered {
		e.t.Fatalf("delivery %d of %s, want %d", md.NumDelivered, id, delivered)
	}
	return msg
}

// handle hands msg to p and acknowledges it (the consume loop's part).
func (e *viewEnv) handle(p *Planner, msg jetstream.Msg) error {
	e.t.Helper()
	err := p.handle(e.ctx, msg)
	if err == nil {
		if aerr := msg.Ack(); aerr != nil {
			e.t.Fatal(aerr)
		}
	}
	return err
}

// step0 has p plan step 0 of run (without its view: nothing of the run is cached), then
// joins the results of its calls as the injector does (two inline, the large one under
// its own key) and returns them as the injector's model.requested for step 1 carries
// them.
func (e *viewEnv) step0(p *Planner, run string) []toolbus.ToolResult {
	e.t.Helper()
	e.start(run)
	e.historyGets()
	if err := e.handle(p, e.request(run+"/0", toolbus.ModelRequested{RunID: run, Step: 0})); err != nil {
		e.t.Fatal(err)
	}
	if b, k := e.historyGets(); b != 0 || k != 0 {
		e.t.Errorf("step 0: %d batched and %d direct gets on the history bucket, want none", b, k)
	}
	lookupErr := toolbus.ToolError{Code: "not_found", Message: "no such thing"}
	unknown := toolbus.ToolError{Code: toolbus.CodeUnknownTool, Message: `no executor serves a tool named "nope"`}
	results := []toolbus.ToolResult{
		{CallID: "c0", Tool: "lookup", Status: toolbus.StatusFailed, Error: &lookupErr,
			Content: `{"error":{"code":"not_found","message":"no such thing","retryable":false}}`, Attempt: 1, Executor: "exec-1"},
		{CallID: "c1", Tool: "big", Status: toolbus.StatusSucceeded, Output: json.RawMessage(`{"lines":"…"}`),
			Content:   strings.Repeat("line of output\n", store.InlineResultMax/10),
			Truncated: &toolbus.Truncation{OriginalBytes: 5 << 20, KeptBytes: 16384, Ref: "kv://toolbus_outputs/big." + run + ".0.c1"},
			Attempt:   1, Executor: "exec-1"},
		{CallID: "c2", Tool: "nope", Status: toolbus.StatusRejected, Error: &unknown,
			Content: `{"error":{"code":"unknown_tool"}}`, Attempt: 1, Executor: "/toolbus/planner/p"},
	}
	st := store.NewStepState(run, 0, len(results))
	budget := e.admin.Store().InlineBudget()
	for i, r := range results {
		if raw := store.EncodeResult(r); len(raw) <= store.InlineResultMax {
			if joined, _ := st.JoinInline(i, raw, budget); !joined {
				e.t.Fatalf("result %d not joined inline", i)
			}
			continue
		}
		if _, _, err := e.admin.Store().PutResult(e.ctx, run, 0, i, r); err != nil {
			e.t.Fatal(err)
		}
		st.Received.Set(i)
	}
	if _, err := e.admin.Store().PutStepState(e.ctx, st, 0); err != nil {
		e.t.Fatal(err)
	}
	if st.Overflowed() != 1 {
		e.t.Fatalf("%d results under their own key, want the large one", st.Overflowed())
	}
	rec, _, err := e.admin.Store().Step(e.ctx, run, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	carried := make([]toolbus.ToolResult, len(rec.Results))
	for i, r := range rec.Results {
		carried[i] = *r
		carried[i].Output = nil
	}
	return carried
}

// wantHistoryFromStore checks that the model read, for step 1 of run, exactly the
// history the store holds (the run's input, step 0's assistant message and its tool
// messages as StepRecord.ToolMessages builds them).
func (e *viewEnv) wantHistoryFromStore(run string) {
	e.t.Helper()
	reqs := e.model.requests(run, 1)
	if len(reqs) == 0 {
		e.t.Fatal("the model was not asked for step 1")
	}
	want, err := runlog.History(e.ctx, e.admin, run, 1)
	if err != nil {
		e.t.Fatal(err)
	}
	rec, _, err := e.admin.Store().Step(e.ctx, run, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	if tools := rec.ToolMessages(); len(tools) != 3 || len(want) < 3 ||
		!bytes.Equal(mustMarshal(e.t, want[len(want)-3:]), mustMarshal(e.t, tools)) || tools[1].Content != rec.Results[1].Content {
		e.t.Fatalf("the store's history does not end in step 0's tool messages: %d tool messages", len(tools))
	}
	for _, req := range reqs {
		if got, w := mustMarshal(e.t, req.Messages), mustMarshal(e.t, want); !bytes.Equal(got, w) {
			e.t.Errorf("the model read for step 1:\n%s\nthe store's history is:\n%s", got, w)
		}
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// recorded returns the assistant message recorded for step of run.
func (e *viewEnv) recorded(run string, step int) toolbus.ModelResponded {
	e.t.Helper()
	mr, err := e.admin.Store().Assistant(e.ctx, run, step)
	if err != nil {
		e.t.Fatal(err)
	}
	return mr
}

// viewModel answers each step from script (by step; the last entry for later steps),
// recording every request.
type viewModel struct {
	mu     sync.Mutex
	reqs   []Request
	script []func(Request) (Response, error)
}

func (m *viewModel) Complete(_ context.Context, req Request) (Response, error) {
	m.mu.Lock()
	m.reqs = append(m.reqs, req)
	script := m.script
	m.mu.Unlock()
	return script[min(req.Step, len(script)-1)](req)
}

func (m *viewModel) set(step int, f func(Request) (Response, error)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.script = append([]func(Request) (Response, error)(nil), m.script...)
	m.script[step] = f
}

func (m *viewModel) requests(run string, step int) []Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Request
	for _, r := range m.reqs {
		if r.RunID == run && r.Step == step {
			out = append(out, r)
		}
	}
	return out
}

// A step whose request carries the results of the step before, which answer the calls
// this planner recorded, is planned with no read of the history bucket at all (step 0
// too), and the model reads the same history as from the store: an error result, a
// large truncated one kept under its own key, a rejected unknown tool.
func TestPlannerViewlessWithCarriedResults(t *testing.T) {
	e := newViewEnv(t)
	p := e.planner("p1")
	const run = "carried-1"
	carried := e.step0(p, run)
	e.historyGets()
	if err := e.handle(p, e.request(run+"/1", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: carried})); err != nil {
		t.Fatal(err)
	}
	if b, k := e.historyGets(); b != 0 || k != 0 {
		t.Errorf("step 1: %d batched and %d direct gets on the history bucket, want none", b, k)
	}
	e.wantHistoryFromStore(run)
	if got := e.recorded(run, 1).Message.ToolCalls; len(got) != 1 || got[0].CallID != "c3" {
		t.Errorf("step 1 recorded %+v", got)
	}
	// The cache advanced as when the view is read: step 2 is planned from it too.
	res := []toolbus.ToolResult{{CallID: "c3", Tool: "lookup", Status: toolbus.StatusSucceeded, Content: "found"}}
	st := store.NewStepState(run, 1, 1)
	st.JoinInline(0, store.EncodeResult(res[0]), e.admin.Store().InlineBudget())
	if _, err := e.admin.Store().PutStepState(e.ctx, st, 0); err != nil {
		t.Fatal(err)
	}
	e.historyGets()
	if err := e.handle(p, e.request(run+"/2", toolbus.ModelRequested{RunID: run, Step: 2, PrevResults: res})); err != nil {
		t.Fatal(err)
	}
	if b, k := e.historyGets(); b != 0 || k != 0 {
		t.Errorf("step 2: %d batched and %d direct gets on the history bucket, want none", b, k)
	}
	reqs := e.model.requests(run, 2)
	want, err := runlog.History(e.ctx, e.admin, run, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 1 || !bytes.Equal(mustMarshal(t, reqs[0].Messages), mustMarshal(t, want)) {
		t.Errorf("step 2: %d model requests; the model read\n%s\nthe store's history is\n%s", len(reqs),
			mustMarshal(t, reqs[len(reqs)-1].Messages), mustMarshal(t, want))
	}
	if st, _, err := e.admin.Store().RunState(e.ctx, run); err != nil || st.Status != toolbus.RunCompleted {
		t.Errorf("run state %+v (%v), want completed", st, err)
	}
}

// Every other request reads the view as before (one batched get at least), and the model
// reads the store's results, never results it could not match to its own calls.
func TestPlannerReadsTheViewOtherwise(t *testing.T) {
	forged := func(carried []toolbus.ToolResult, change func([]toolbus.ToolResult) []toolbus.ToolResult) []toolbus.ToolResult {
		out := append([]toolbus.ToolResult(nil), carried...)
		for i := range out {
			out[i].Content = "FORGED"
		}
		return change(out)
	}
	for _, tc := range []struct {
		name string
		// plan delivers the request for step 1 to a planner and returns the error of its
		// handler.
		plan func(e *viewEnv, p *Planner, run string, carried []toolbus.ToolResult) error
	}{
		{"redelivered", func(e *viewEnv, p *Planner, run string, carried []toolbus.ToolResult) error {
			first := e.request(run+"/1", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: carried})
			if err := first.Nak(); err != nil {
				t.Fatal(err)
			}
			e.historyGets()
			return e.handle(p, e.next(run+"/1", events.SubjectModelRequested(run), 2))
		}},
		{"results missing", func(e *viewEnv, p *Planner, run string, _ []toolbus.ToolResult) error {
			msg := e.request(run+"/1", toolbus.ModelRequested{RunID: run, Step: 1})
			e.historyGets()
			return e.handle(p, msg)
		}},
		{"results of other calls", func(e *viewEnv, p *Planner, run string, carried []toolbus.ToolResult) error {
			msg := e.request(run+"/1", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: forged(carried, func(r []toolbus.ToolResult) []toolbus.ToolResult {
				r[1].CallID = "c9"
				return r
			})})
			e.historyGets()
			return e.handle(p, msg)
		}},
		{"results of other tools", func(e *viewEnv, p *Planner, run string, carried []toolbus.ToolResult) error {
			msg := e.request(run+"/1", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: forged(carried, func(r []toolbus.ToolResult) []toolbus.ToolResult {
				r[0].Tool = "big"
				return r
			})})
			e.historyGets()
			return e.handle(p, msg)
		}},
		{"fewer results", func(e *viewEnv, p *Planner, run string, carried []toolbus.ToolResult) error {
			msg := e.request(run+"/1", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: forged(carried, func(r []toolbus.ToolResult) []toolbus.ToolResult {
				return r[:2]
			})})
			e.historyGets()
			return e.handle(p, msg)
		}},
		{"results out of order", func(e *viewEnv, p *Planner, run string, carried []toolbus.ToolResult) error {
			msg := e.request(run+"/1", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: forged(carried, func(r []toolbus.ToolResult) []toolbus.ToolResult {
				r[0], r[2] = r[2], r[0]
				return r
			})})
			e.historyGets()
			return e.handle(p, msg)
		}},
		{"another planner planned step 0", func(e *viewEnv, _ *Planner, run string, carried []toolbus.ToolResult) error {
			msg := e.request(run+"/1", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: carried})
			e.historyGets()
			return e.handle(e.planner("p2"), msg)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newViewEnv(t)
			p := e.planner("p1")
			run := "read-" + strings.ReplaceAll(tc.name, " ", "-")
			carried := e.step0(p, run)
			if err := tc.plan(e, p, run, carried); err != nil {
				t.Fatal(err)
			}
			if b, _ := e.historyGets(); b == 0 {
				t.Error("step 1 planned without reading its view")
			}
			e.wantHistoryFromStore(run)
			if n := len(e.model.requests(run, 1)); n != 1 {
				t.Errorf("%d model calls for step 1, want 1", n)
			}
		})
	}
}

// A duplicate request for a step another planner already answered, on its first
// delivery with matching results, calls the model once more (the view is not read), and
// publishes and remembers the answer recorded first: no second answer is recorded, and
// a failure of the extra call neither holds the step nor ends the run.
func TestPlannerViewlessDuplicatePublishesRecordedAnswer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model func(Request) (Response, error)
	}{
		{"model answers", answerCalls([]toolbus.ToolCall{{CallID: "other", Tool: "lookup", Arguments: `{"other":1}`}})},
		{"model fails", func(Request) (Response, error) { return Response{}, Permanent(errors.New("no such model")) }},
		{"model fails for now", func(Request) (Response, error) { return Response{}, errors.New("try later") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newViewEnv(t)
			p := e.planner("p1")
			run := "dup-" + strings.ReplaceAll(tc.name, " ", "-")
			carried := e.step0(p, run)
			// Another planner answered step 1 (as it would from the same request).
			first := toolbus.ModelResponded{RunID: run, Step: 1, Model: "first",
				Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "first answer", ToolCalls: viewCalls1}}
			if _, created, err := e.admin.Store().PutAssistant(e.ctx, first); err != nil || !created {
				t.Fatalf("record the first answer: created %v, %v", created, err)
			}
			e.model.set(1, tc.model)
			responded, err := e.srv.Conn.SubscribeSync(events.SubjectModelResponded(run))
			if err != nil {
				t.Fatal(err)
			}
			if err := e.srv.Conn.Flush(); err != nil {
				t.Fatal(err)
			}
			e.historyGets()
			if err := e.handle(p, e.request(run+"/1-dup", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: carried})); err != nil {
				t.Fatal(err)
			}
			if b, _ := e.historyGets(); b != 0 {
				t.Errorf("%d batched gets: the duplicate read the view", b)
			}
			if n := len(e.model.requests(run, 1)); n != 1 {
				t.Errorf("%d model calls for step 1, want the extra one", n)
			}
			msg, err := responded.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("no model.responded published: %v", err)
			}
			var got toolbus.ModelResponded
			if _, err := events.Decode(msg, &got); err != nil {
				t.Fatal(err)
			}
			if got.Model != "first" || got.Message.Content != "first answer" {
				t.Errorf("published %+v, want the recorded answer", got)
			}
			if rec := e.recorded(run, 1); rec.Model != "first" {
				t.Errorf("recorded %+v, want the first answer", rec)
			}
			if st, _, err := e.admin.Store().RunState(e.ctx, run); err != nil || st.Status != toolbus.RunRunning {
				t.Errorf("run state %+v (%v), want running", st, err)
			}
			// The planner remembers the recorded answer: step 2's history has it.
			p.mu.Lock()
			h := p.cache[run]
			p.mu.Unlock()
			if h == nil || h.upTo != 1 || h.pending == nil || h.pending.Content != "first answer" {
				t.Errorf("cache %+v, want step 1's recorded answer pending", h)
			}
		})
	}
}

// A request whose data names another run than its subject is refused before anything
// is planned, whatever results it carries.
func TestPlannerRefusesRequestForAnotherRun(t *testing.T) {
	e := newViewEnv(t)
	p := e.planner("p1")
	const run = "victim-1"
	carried := e.step0(p, run)
	ev := events.ModelRequestedEvent("/test", toolbus.ModelRequested{RunID: run, Step: 1, PrevResults: carried})
	ev.Meta.ID, ev.Meta.RunID = "decoy/1", "decoy" // only the data names the victim
	subject := events.SubjectModelRequested("decoy")
	if _, err := e.admin.Publish(e.ctx, subject, ev.Meta, ev.Data); err != nil {
		t.Fatal(err)
	}
	err := p.handle(e.ctx, e.next("decoy/1", subject, 1))
	if !errors.Is(err, events.ErrPoison) {
		t.Fatalf("handle: %v, want poison", err)
	}
	if n := len(e.model.requests(run, 1)); n != 0 {
		t.Errorf("%d model calls for step 1, want none", n)
	}
}

// The matching rule itself.
func TestAnswers(t *testing.T) {
	calls := []toolbus.ToolCall{{CallID: "a", Tool: "x"}, {CallID: "b", Tool: "y"}}
	ok := func() []toolbus.ToolResult {
		return []toolbus.ToolResult{{CallID: "a", Tool: "x", Status: toolbus.StatusSucceeded}, {CallID: "b", Tool: "y", Status: toolbus.StatusFailed}}
	}
	for name, tc := range map[string]struct {
		results []toolbus.ToolResult
		want    bool
	}{
		"match":      {ok(), true},
		"none":       {nil, false},
		"fewer":      {ok()[:1], false},
		"more":       {append(ok(), toolbus.ToolResult{CallID: "c", Tool: "z", Status: toolbus.StatusSucceeded}), false},
		"other id":   {func() []toolbus.ToolResult { r := ok(); r[1].CallID = "z"; return r }(), false},
		"other tool": {func() []toolbus.ToolResult { r := ok(); r[0].Tool = "y"; return r }(), false},
		"swapped":    {func() []toolbus.ToolResult { r := ok(); r[0], r[1] = r[1], r[0]; return r }(), false},
		"bad status": {func() []toolbus.ToolResult { r := ok(); r[0].Status = "done"; return r }(), false},
	} {
		if got := answers(tc.results, calls); got != tc.want {
			t.Errorf("%s: answers = %v, want %v", name, got, tc.want)
		}
	}
	if answers(nil, nil) {
		t.Error("no results answer no calls: nothing to carry, the view is read")
	}
}
