package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// TestTeamAccountExecutor: an executor in its team's own account (TOOLBUS_NATS_API_PREFIX)
// serves its tools to runs of the core account with nothing but the imports of the
// accounts layout: it binds its queues, claims, publishes its contracts, heartbeats and
// results, runs two calls of one tool in one step once each, and applies an edited
// approval carried by the re-issued call, which it cannot read from the approval store.
func TestTeamAccountExecutor(t *testing.T) {
	srv := intaketest.StartAccounts(t, "alpha", []string{"calc", "pay", "hang", "big"})
	connect := func(user string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	var calcRuns, payRuns atomic.Int32
	var paid atomic.Value
	hanging, hangEnded := make(chan struct{}, 1), make(chan error, 1)
	script := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(toolbus.ToolCall{CallID: "c1", Tool: "calc", Arguments: `{"n":1}`},
			toolbus.ToolCall{CallID: "c2", Tool: "calc", Arguments: `{"n":2}`},
			toolbus.ToolCall{CallID: "p1", Tool: "pay", Arguments: `{"amount":100}`},
			toolbus.ToolCall{CallID: "b1", Tool: "big", Arguments: `{}`}),
		planner.Answer("done")}}
	hang := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(toolbus.ToolCall{CallID: "h1", Tool: "hang", Arguments: `{}`}), planner.Answer("never")}}
	p := testpipe.StartOn(t, connect("core"), 3*time.Minute, testpipe.ScriptByRun(map[string]*planner.Script{"team-1": script, "team-2": hang}, nil))
	for _, tool := range []string{"calc", "pay", "hang", "big"} {
		if _, err := provision.Consumer(p.Ctx, p.Bus, provision.ToolConsumerConfig(tool, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}

	reg := executor.NewRegistry()
	obj := json.RawMessage(`{"type":"object"}`)
	for _, tool := range []executor.Tool{
		{Name: "calc", Description: "doubles n", InputSchema: obj, Func: func(_ context.Context, args json.RawMessage) (any, error) {
			calcRuns.Add(1)
			var a struct{ N int }
			_ = json.Unmarshal(args, &a)
			return map[string]int{"double": 2 * a.N}, nil
		}},
		{Name: "pay", Description: "pays", InputSchema: obj, NeedsApproval: true, Func: func(_ context.Context, args json.RawMessage) (any, error) {
			payRuns.Add(1)
			paid.Store(string(args))
			return "paid", nil
		}},
		{Name: "big", Description: "a large output", InputSchema: obj, Func: func(context.Context, json.RawMessage) (any, error) {
			return strings.Repeat("x", 300_000), nil
		}},
		{Name: "hang", Description: "waits for its context", InputSchema: obj, Timeout: 10 * time.Minute, Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			hanging <- struct{}{}
			<-ctx.Done()
			hangEnded <- context.Cause(ctx)
			return nil, ctx.Err()
		}},
	} {
		if err := reg.Register(tool); err != nil {
			t.Fatal(err)
		}
	}
	teamBus, err := events.Open(p.Ctx, connect("alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(p.Log), executor.WithInstance("alpha-1")))
	w, err := worker.New(teamBus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: p.Log, Grace: time.Second}, Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	p.Roles.Go("alpha-1", w.Run)
	p.WaitTools("calc", "pay")

	p.SubmitAs("team-1", "alice", "go", toolbus.Limits{})
	p.WaitStatus("team-1", toolbus.RunWaitingForApproval)
	if _, err := p.Bus.PublishApproval(p.Ctx, "/test", 0, toolbus.Approval{RunID: "team-1", CallID: "p1", Who: "alice",
		Arguments: `{"amount":90}`}, true); err != nil {
		t.Fatal(err)
	}
	p.WaitStatus("team-1", toolbus.RunCompleted)

	evs, err := runlog.Events(p.Ctx, p.Bus, "team-1")
	if err != nil {
		t.Fatal(err)
	}
	rep := audit.Analyze("team-1", evs)
	if len(rep.Violations) > 0 {
		t.Fatalf("violations: %v", rep.Violations)
	}
	got := map[string]string{}
	var bigRef string
	for _, c := range rep.Calls {
		if c.Result != nil && c.Result.Truncated != nil {
			bigRef = c.Result.Truncated.Ref
		}
		if c.Result == nil || c.Result.Status != toolbus.StatusSucceeded {
			t.Fatalf("call %s: %+v", c.CallID, c.Result)
		}
		got[c.CallID] = c.Result.Content
	}
	if got["c1"] != `{"double":2}` || got["c2"] != `{"double":4}` || !strings.Contains(got["p1"], "paid") {
		t.Fatalf("results: %v", got)
	}
	// Its large output went into the core's outputs bucket, under its tool's keys.
	if data, err := p.Bus.Store().Output(p.Ctx, bigRef); err != nil || len(data) < 300_000 {
		t.Fatalf("large output %q: %d bytes, %v", bigRef, len(data), err)
	}
	if calcRuns.Load() != 2 || payRuns.Load() != 1 || paid.Load() != `{"amount":90}` {
		t.Fatalf("side effects: calc %d, pay %d with %v", calcRuns.Load(), payRuns.Load(), paid.Load())
	}
	// Its claims say the calls are done: a take-over would not run them again.
	for _, id := range []string{"c1", "c2", "p1"} {
		tool := map[string]string{"c1": "calc", "c2": "calc", "p1": "pay"}[id]
		c, _, err := p.Bus.Store().CurrentClaim(p.Ctx, tool, "team-1", 0, id)
		if err != nil || !c.Done || c.Team != "alpha" {
			t.Fatalf("claim of %s: %+v %v", id, c, err)
		}
	}

	// A cancel reaches the team's call through the core's notice: the team hears no
	// run.cancel of the core account.
	p.SubmitAs("team-2", "alice", "hang", toolbus.Limits{})
	select {
	case <-hanging:
	case <-p.Ctx.Done():
		t.Fatal("the hanging call never started")
	}
	if _, err := p.Bus.PublishCancel(p.Ctx, "/test", toolbus.Cancel{RunID: "team-2", Who: "alice", Reason: "enough"}); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-hangEnded:
		if cause == nil {
			t.Fatal("the call ended without a cause")
		}
	case <-time.After(time.Minute):
		t.Fatal("the team's call was not cancelled when its run was")
	}
	p.WaitStatus("team-2", toolbus.RunCancelled)
}

// TestTeamResultsCannotBeSquatted: the stream's duplicate window is keyed by message id
// across every subject, and a result's id is deterministic. Team beta, in its own
// account, publishes on its own tool's result subject under the ids of the result and
// the wait that alpha's calls will publish; alpha's events are stored all the same (its
// message ids are keyed by its credentials) and its run completes.
func TestTeamResultsCannotBeSquatted(t *testing.T) {
	srv := intaketest.StartTeams(t, map[string][]string{"alpha": {"calc"}, "beta": {"other"}})
	connect := func(user string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	script := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(toolbus.ToolCall{CallID: "c1", Tool: "calc", Arguments: `{}`}), planner.Answer("done")}}
	p := testpipe.StartOn(t, connect("core"), 2*time.Minute, testpipe.ScriptByRun(map[string]*planner.Script{"sq-1": script}, nil))
	if _, err := provision.Consumer(p.Ctx, p.Bus, provision.ToolConsumerConfig("calc", 0, 0)); err != nil {
		t.Fatal(err)
	}
	beta := connect("beta")
	for _, id := range []string{events.IDToolFinished("sq-1", 0, "c1"), events.IDToolWaiting("sq-1", 0, "c1")} {
		m := nats.NewMsg(events.SubjectToolFinished("sq-1", "other"))
		m.Header.Set(events.HeaderMsgID, id)
		m.Data = []byte(`{"squat":true}`)
		if _, err := beta.RequestMsg(m, 5*time.Second); err != nil {
			t.Fatalf("beta's publish on its own subject: %v", err)
		}
	}
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "calc", Description: "answers", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) { return "ok", nil }}); err != nil {
		t.Fatal(err)
	}
	teamBus, err := events.Open(p.Ctx, connect("alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(p.Log), executor.WithInstance("alpha-1")))
	w, err := worker.New(teamBus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: p.Log, Grace: time.Second}, Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	p.Roles.Go("alpha-1", w.Run)
	p.WaitTools("calc")
	p.SubmitAs("sq-1", "alice", "go", toolbus.Limits{})
	p.WaitStatus("sq-1", toolbus.RunCompleted)
}
