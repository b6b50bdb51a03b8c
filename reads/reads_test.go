package reads_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// tenants starts the accounts layout with three clients, each bound to the identity
// of its name, the pipeline and the read service in the core account, and returns a
// connection maker and the pipeline.
func tenants(t *testing.T, model planner.Model, extra ...executor.Tool) (func(user string) *nats.Conn, *testpipe.Pipeline) {
	t.Helper()
	srv := intaketest.StartTenants(t, nil, map[string][]string{"alice": {"alice"}, "bob": {"bob"}, "carol": {"carol"}})
	connect := func(user string) *nats.Conn { return eventstest.Connect(t, srv, user) }
	p := testpipe.StartOn(t, connect("core"), 3*time.Minute, model, extra...)
	p.Roles.Go("reads", reads.New(p.Bus, p.Log).Serve)
	return connect, p
}

// clientBus opens the bus of a client in its own account, reading as id.
func clientBus(t *testing.T, ctx context.Context, nc *nats.Conn, id string) *events.Bus {
	t.Helper()
	var bus *events.Bus
	eventstest.Eventually(t, 30*time.Second, func() error { // the read service subscribes as the pipeline starts
		var err error
		bus, err = events.Open(ctx, nc, events.Config{ReadPrefix: events.ReadAPIPrefix(id)})
		return err
	})
	if !bus.ClientAccount() {
		t.Fatal("a bus opened with a read prefix is not a client account's")
	}
	return bus
}

// TestClientAccountsReadTheirOwnRuns: clients in accounts of their own start runs,
// follow them, decide their calls and list them through the read service; another
// client sees none of it by any route the service offers, and may not act in another's
// name. The same requests made as the run's principal find the run, so a probe that
// finds nothing is a probe that could have.
func TestClientAccountsReadTheirOwnRuns(t *testing.T) {
	script := func() *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(toolbus.ToolCall{CallID: "r1", Tool: "restart_service", Arguments: `{"service":"auth-api"}`}),
			planner.Answer("restarted")}}
	}
	connect, p := tenants(t, testpipe.ScriptByRun(map[string]*planner.Script{"alice-1": script(), "alice-2": script()}, nil))
	ctx := p.Ctx
	alice := clientBus(t, ctx, connect("alice"), "alice")
	bob := clientBus(t, ctx, connect("bob"), "bob")
	carol := clientBus(t, ctx, connect("carol"), "carol")

	start := func(bus *events.Bus, run, principal string, approvers ...string) error {
		return bus.StartRun(ctx, "test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: principal},
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "restart auth-api"}}, Approvers: approvers})
	}
	if err := start(alice, "alice-1", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := start(alice, "alice-2", "alice", "carol"); err != nil {
		t.Fatal(err)
	}
	if err := start(bob, "bob-as-alice", "alice"); !errors.Is(err, events.ErrNotBound) {
		t.Fatalf("bob started a run as alice: %v, want ErrNotBound", err)
	}
	if err := start(bob, "alice-1", "bob"); !errors.Is(err, events.ErrRunExists) {
		t.Fatalf("bob started a run of alice's run id: %v, want ErrRunExists", err)
	}
	// Bob stores, on a subject of alice's run he may publish, a message that reads as a
	// direct get's "not found": alice's readers must read on past it.
	forged := &nats.Msg{Subject: events.SubjectRunCancel("alice-1", "bob"), Header: nats.Header{"Status": {"404"}, "Description": {"Message Not Found"}}}
	if _, err := connect("bob").RequestMsg(forged, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	// The call waits for a decision; alice finds it through the read service and decides.
	var step int
	eventstest.Eventually(t, time.Minute, func() error {
		var err error
		step, _, err = decide.Waiting(ctx, alice, "alice-1", "r1")
		return err
	})
	if _, _, err := decide.Waiting(ctx, bob, "alice-1", "r1"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("bob found alice's waiting call: %v", err)
	}
	if _, err := bob.PublishApproval(ctx, "test", step, toolbus.Approval{RunID: "alice-1", CallID: "r1", Who: "alice"}, true); !errors.Is(err, events.ErrNotBound) {
		t.Fatalf("bob approved as alice: %v, want ErrNotBound", err)
	}
	if _, err := alice.PublishApproval(ctx, "test", step, toolbus.Approval{RunID: "alice-1", CallID: "r1", Who: "alice"}, true); err != nil {
		t.Fatal(err)
	}
	w, err := runlog.Watch(ctx, alice, events.SubjectRun("alice-1"), true)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for ended := false; !ended; {
		ev, ok, err := w.Next(ctx, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			seen = append(seen, ev.Meta.Type)
			ended = ev.IsRunEnded() && ev.Meta.Type != "toolbus.run.waiting_for_approval"
		}
	}
	if !slices.Contains(seen, events.TypeToolFinished) || seen[len(seen)-1] != "toolbus.run.completed" {
		t.Fatalf("alice followed %v: want a tool.finished and the run completed", seen)
	}

	// Lists: each identity its own runs, and the runs naming it an approver.
	ids := func(bus *events.Bus) []string {
		runs, err := bus.Runs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range runs {
			out = append(out, r.RunID)
		}
		slices.Sort(out)
		return out
	}
	if got := ids(alice); !slices.Equal(got, []string{"alice-1", "alice-2"}) {
		t.Errorf("alice lists %v", got)
	}
	if got := ids(carol); !slices.Equal(got, []string{"alice-2"}) {
		t.Errorf("carol (an approver of alice-2 only) lists %v", got)
	}
	if got := ids(bob); len(got) != 0 {
		t.Errorf("bob lists %v", got)
	}

	// Every read of alice's run as bob finds nothing; as alice, it finds the run.
	for _, tc := range []struct {
		name string
		read func(*events.Bus) error
	}{
		{"run events", func(b *events.Bus) error {
			evs, err := runlog.Events(ctx, b, "alice-1")
			if err == nil && len(evs) == 0 {
				return events.ErrNotFound
			}
			return err
		}},
		{"run.started", func(b *events.Bus) error { _, err := b.RunStarted(ctx, "alice-1"); return err }},
		{"last event", func(b *events.Bus) error {
			_, err := runlog.Last(ctx, b, events.SubjectRunEnded("alice-1", toolbus.RunCompleted))
			return err
		}},
		{"run state", func(b *events.Bus) error { _, _, err := b.Store().RunState(ctx, "alice-1"); return err }},
		{"history", func(b *events.Bus) error { _, err := runlog.History(ctx, b, "alice-1", 1); return err }},
		{"decision", func(b *events.Bus) error { _, err := b.Store().StepDecision(ctx, "alice-1", step, "r1"); return err }},
	} {
		if err := tc.read(alice); err != nil {
			t.Errorf("%s: alice cannot read her own run: %v", tc.name, err)
		}
		if err := tc.read(bob); err == nil {
			t.Errorf("%s: bob read alice's run", tc.name)
		}
	}
	probeService(t, connect("bob"), connect("alice"))
}

// probeService sends the read service requests outside what it offers, as bob: each is
// refused or finds nothing, and bob's account reaches no other identity's service nor
// the core's JetStream API. The control, alice asking for her own run, finds it.
func probeService(t *testing.T, bob, alice *nats.Conn) {
	t.Helper()
	ask := func(nc *nats.Conn, subject, body string) (*nats.Msg, error) {
		return nc.Request(subject, []byte(body), 5*time.Second)
	}
	api := events.ReadAPIPrefix("bob")
	for _, tc := range []struct{ subject, body, want string }{
		{api + ".DIRECT.GET.TOOLBUS", `{"seq":1}`, "400"},
		{api + ".DIRECT.GET.TOOLBUS", `{"seq":1,"next_by_subj":"toolbus.>"}`, "400"},
		{api + ".DIRECT.GET.TOOLBUS", `{"seq":1,"next_by_subj":"toolbus.*.run.started.alice"}`, "400"},
		{api + ".DIRECT.GET.TOOLBUS", `{"seq":1,"next_by_subj":"toolbus.alice-1.>"}`, "404"},
		{api + ".DIRECT.GET.TOOLBUS", `{"seq":1,"batch":10,"next_by_subj":"toolbus.alice-1.>"}`, "400"},
		{api + ".DIRECT.GET.TOOLBUS", `{"multi_last":["toolbus.alice-1.>"]}`, "400"},
		{api + ".DIRECT.GET.TOOLBUS.toolbus.alice-1.run.completed", ``, "404"},
		{api + ".DIRECT.GET.KV_toolbus_runs.$KV.toolbus_runs.alice-1", ``, "404"},
		{api + ".DIRECT.GET.KV_toolbus_history", `{"seq":1,"next_by_subj":"$KV.toolbus_history.>"}`, "400"},
		{api + ".DIRECT.GET.KV_toolbus_claims", `{"seq":1,"next_by_subj":"$KV.toolbus_claims.>"}`, "404"},
		{api + ".DIRECT.GET.KV_toolbus_secrets", `{"seq":1,"next_by_subj":"$KV.toolbus_secrets.>"}`, "404"},
		{api + ".DIRECT.GET.KV_toolbus_outputs", `{"seq":1,"next_by_subj":"$KV.toolbus_outputs.restart_service.alice-1.>"}`, "404"},
	} {
		m, err := ask(bob, tc.subject, tc.body)
		if err != nil {
			t.Errorf("%s %s: %v", tc.subject, tc.body, err)
			continue
		}
		if got := m.Header.Get("Status"); got != tc.want || len(m.Data) != 0 {
			t.Errorf("%s %s: status %q and %d bytes, want %s and nothing", tc.subject, tc.body, got, len(m.Data), tc.want)
		}
	}
	// Stream infos say nothing of the subjects of others, even when asked to.
	m, err := ask(bob, api+".STREAM.INFO.TOOLBUS", `{"subjects_filter":">"}`)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		State map[string]any `json:"state"`
	}
	if err := json.Unmarshal(m.Data, &info); err != nil || info.State == nil {
		t.Fatalf("stream info: %v %s", err, m.Data)
	}
	for k := range info.State {
		if k != "last_seq" && k != "last_ts" {
			t.Errorf("stream info tells bob %s: %s", k, m.Data)
		}
	}
	for _, s := range []string{"KV_toolbus_claims", "KV_toolbus_secrets", "KV_toolbus_instances"} {
		m, err := ask(bob, api+".STREAM.INFO."+s, "")
		if err != nil || !strings.Contains(string(m.Data), `"code":404`) {
			t.Errorf("stream info of %s for bob: %v %s", s, err, m.Data)
		}
	}
	// Outside bob's own service subjects nothing of the core answers in his account (his
	// account's own JetStream API says it is not enabled).
	for _, subject := range []string{events.ReadAPIPrefix("alice") + ".STREAM.INFO.TOOLBUS", "$JS.API.STREAM.INFO.TOOLBUS",
		"$JS.API.DIRECT.GET.TOOLBUS.toolbus.alice-1.run.completed", "$KV.toolbus_runs.alice-1"} {
		m, err := ask(bob, subject, "")
		if err == nil && (m.Header.Get("Nats-Stream") != "" || !strings.Contains(string(m.Data), `"error"`)) {
			t.Errorf("%s from bob's account answered: %v %s", subject, m.Header, m.Data)
		}
	}
	// The control: alice's own run, by the same forms.
	for _, subject := range []string{
		events.ReadAPIPrefix("alice") + ".DIRECT.GET.TOOLBUS.toolbus.alice-1.run.completed",
		events.ReadAPIPrefix("alice") + ".DIRECT.GET.KV_toolbus_runs.$KV.toolbus_runs.alice-1",
	} {
		m, err := ask(alice, subject, "")
		if err != nil || len(m.Data) == 0 {
			t.Errorf("control: alice reads %s: %v %v", subject, err, m)
		}
	}
	m, err = ask(alice, events.ReadAPIPrefix("alice")+".DIRECT.GET.TOOLBUS", fmt.Sprintf(`{"seq":1,"next_by_subj":%q}`, "toolbus.alice-1.>"))
	if err != nil || len(m.Data) == 0 {
		t.Errorf("control: alice reads her run's first event: %v %v", err, m)
	}
}

// TestClientAccountAnswersAndChecks: what the client commands do besides following and
// deciding, from a client account: a tool's question is found and answered by the run's
// principal (toolbus answer) and by nobody else, a call's tool and a run's allowlist are
// checked against the catalog entry by entry (toolbus call, run --tools), acting as an
// identity the account is not bound to is refused before anything is read
// (Bus.CheckBound), and following every run is refused saying why (toolbus tail).
func TestClientAccountAnswersAndChecks(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"account":{"type":"string"}},"required":["account"]}`)
	ask := executor.Tool{Name: "pick_account", Description: "asks its caller which account to use",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			a, err := executor.Ask(ctx, "Which account?", schema)
			if err != nil {
				return nil, err
			}
			return map[string]any{"answer": a.Content, "by": a.Who}, nil
		}}
	model := testpipe.ScriptByRun(map[string]*planner.Script{"alice-q": {Steps: []func(planner.Request) planner.Response{
		planner.Calls(toolbus.ToolCall{CallID: "q1", Tool: "pick_account", Arguments: `{}`}), planner.Answer("done")}}}, nil)
	connect, p := tenants(t, model, ask)
	ctx := p.Ctx
	alice := clientBus(t, ctx, connect("alice"), "alice")
	bob := clientBus(t, ctx, connect("bob"), "bob")

	if _, err := runlog.Watch(ctx, alice, events.FilterAll, true); !errors.Is(err, events.ErrOneRun) {
		t.Errorf("alice watches every run: %v, want ErrOneRun", err)
	}
	if err := alice.CheckBound(ctx, "alice"); err != nil {
		t.Errorf("alice's account is bound to alice: %v", err)
	}
	if err := bob.CheckBound(ctx, "alice"); !errors.Is(err, events.ErrNotBound) {
		t.Errorf("bob's account acts as alice: %v, want ErrNotBound", err)
	}
	var refused *callrun.RefusedError
	if tc, err := callrun.Contract(ctx, alice, "pick_account"); err != nil || tc.Name != "pick_account" {
		t.Errorf("alice reads the catalog entry of pick_account: %+v %v", tc, err)
	}
	if _, err := callrun.Contract(ctx, alice, "nope"); !errors.As(err, &refused) {
		t.Errorf("alice calls a tool nobody published: %v, want a refusal", err)
	}
	if err := callrun.CheckAllowed(ctx, alice, []string{"pick_account", "restart_service"}); err != nil {
		t.Errorf("alice allows published tools: %v", err)
	}
	if err := callrun.CheckAllowed(ctx, alice, []string{"pick_account", "nope"}); !errors.As(err, &refused) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("alice allows a tool nobody published: %v, want a refusal naming it", err)
	}

	if err := alice.StartRun(ctx, "test", toolbus.RunStarted{RunID: "alice-q", Principal: toolbus.Principal{ID: "alice"},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "pay"}}}); err != nil {
		t.Fatal(err)
	}
	var q toolbus.ToolQuestion
	eventstest.Eventually(t, time.Minute, func() error {
		var err error
		q, err = decide.OpenQuestion(ctx, alice, "alice-q", "q1")
		return err
	})
	if _, err := decide.OpenQuestion(ctx, bob, "alice-q", "q1"); err == nil || err.Error() != "run alice-q not found" {
		t.Errorf("bob opens alice's question: %v, want run alice-q not found", err)
	}
	a, err := decide.Answer(q, "alice", `{"account":"savings"}`, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bob.PublishEvent(ctx, events.ToolAnswerEvent("test", a)); !errors.Is(err, events.ErrNotBound) {
		t.Errorf("bob answers as alice: %v, want ErrNotBound", err)
	}
	if _, err := alice.PublishEvent(ctx, events.ToolAnswerEvent("test", a)); err != nil {
		t.Fatal(err)
	}
	w, err := runlog.Watch(ctx, alice, events.SubjectRun("alice-q"), true)
	if err != nil {
		t.Fatal(err)
	}
	var result string
	for ended := false; !ended; {
		ev, ok, err := w.Next(ctx, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		if ev.Meta.Type == events.TypeToolFinished {
			result = string(ev.Data)
		}
		ended = ev.IsRunEnded() && ev.Meta.Type != "toolbus.run.waiting_for_approval"
	}
	if !strings.Contains(result, "savings") || !strings.Contains(result, `\"by\":\"alice\"`) {
		t.Errorf("the tool's result %s: want alice's answer", result)
	}
}

// TestClientFollowsItsRunLive: a client in an account of its own follows its identity's
// run live through the read service (follow.Run): the follow opened before the
// call is approved hears the call's result and the run's outcome as they are stored,
// then ends. Bob is refused following alice's run exactly as a run that does not exist,
// his account reaches no follow of alice's identity, and an identity's follows are
// bounded (reads.MaxFollows). The control is alice's own follow of the same run.
func TestClientFollowsItsRunLive(t *testing.T) {
	script := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(toolbus.ToolCall{CallID: "r1", Tool: "restart_service", Arguments: `{"service":"auth-api"}`}),
		planner.Answer("restarted")}}
	connect, p := tenants(t, testpipe.ScriptByRun(map[string]*planner.Script{"alice-f": script}, nil))
	ctx := p.Ctx
	alice := clientBus(t, ctx, connect("alice"), "alice")
	bob := clientBus(t, ctx, connect("bob"), "bob")
	if err := alice.StartRun(ctx, "test", toolbus.RunStarted{RunID: "alice-f", Principal: toolbus.Principal{ID: "alice"},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "restart auth-api"}}}); err != nil {
		t.Fatal(err)
	}
	f, err := follow.Run(ctx, alice, "alice-f", 1)
	if err != nil {
		t.Fatalf("control: alice follows her own run: %v", err)
	}
	defer func() { _ = f.Close() }()
	for _, run := range []string{"alice-f", "no-such-run"} {
		if _, err := follow.Run(ctx, bob, run, 1); !errors.Is(err, events.ErrNotFound) {
			t.Errorf("bob follows %s: %v, want ErrNotFound", run, err)
		}
	}
	if _, err := connect("bob").Request(events.FollowSubject("alice", "alice-f"), nil, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("bob's account requests alice's follow: %v, want no responders", err)
	}

	var step int
	eventstest.Eventually(t, time.Minute, func() error {
		var err error
		step, _, err = decide.Waiting(ctx, alice, "alice-f", "r1")
		return err
	})
	var seen []string
	next := func() (runlog.StoredEvent, error) {
		for {
			ev, ok, err := f.Next(ctx, time.Second)
			if err != nil || ok {
				return ev, err
			}
		}
	}
	// Up to the call's waiting (stored before the approval exists).
	for !slices.Contains(seen, "toolbus.run.waiting_for_approval") {
		ev, err := next()
		if err != nil {
			t.Fatalf("alice's follow after %v: %v", seen, err)
		}
		seen = append(seen, ev.Meta.Type)
	}
	if _, err := alice.PublishApproval(ctx, "test", step, toolbus.Approval{RunID: "alice-f", CallID: "r1", Who: "alice"}, true); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("alice's follow after %v: %v", seen, err)
		}
		seen = append(seen, ev.Meta.Type)
	}
	if seen[0] != events.TypeRunStarted || !slices.Contains(seen, events.TypeToolFinished) || seen[len(seen)-1] != "toolbus.run.completed" {
		t.Errorf("alice followed %v: want the run from its start, the call's result (stored after the follow began) and its outcome", seen)
	}

	// An identity's follows are bounded; the next one is refused saying so.
	for i := range reads.MaxFollows {
		if _, err := follow.Run(ctx, alice, "alice-f", 0); err != nil {
			t.Fatalf("alice's follow %d: %v", i+1, err)
		}
	}
	if _, err := follow.Run(ctx, alice, "alice-f", 0); err == nil || !strings.Contains(err.Error(), "429") {
		t.Errorf("alice's follow beyond %d: %v, want a 429", reads.MaxFollows, err)
	}
}
