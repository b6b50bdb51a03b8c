package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// startTenants starts a server of the accounts layout with the teams and the core's
// write service bounded by lim, and returns it with the service (its Counts).
func startTenants(t *testing.T, teams map[string][]string, lim intake.Limits) (*server.Server, *intake.Service) {
	t.Helper()
	srv := eventstest.StartTenantsBare(t, teams, nil)
	return srv, intaketest.ServeIntake(t, eventstest.Connect(t, srv, "core"), lim)
}

// drain spends the team's budget at the write service with writes on nc (a connection
// of the team's account) on subject, halving each refused write down to one byte: the
// team is then left less than one byte. It returns how many of its writes were refused.
func drain(ctx context.Context, t *testing.T, nc *nats.Conn, subject string) int {
	t.Helper()
	refused := 0
	for size := 4096; size >= 1; {
		r, err := nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subject, Data: []byte(strings.Repeat("d", size))})
		if err != nil {
			t.Errorf("drain: %v", err)
			return refused
		}
		var a struct {
			Error *struct{ Code int } `json:"error"`
		}
		if err := json.Unmarshal(r.Data, &a); err != nil {
			t.Errorf("drain: %v: %s", err, r.Data)
			return refused
		}
		if a.Error != nil {
			if a.Error.Code != 429 {
				t.Errorf("drain: refused with %d", a.Error.Code)
			}
			refused++
			size /= 2
		}
	}
	return refused
}

// TestTeamResultOverQuotaRetried: a team executor whose result the core's write service
// refuses over the team's bytes per second (429, events.ErrTenantQuota) sends it again
// in place, with the call's heartbeats, until it passes: the run completes and the tool
// ran once. The tool itself spends the team's budget (as a flood of the team's other
// writes would) before it returns, so the result's first publish is refused.
func TestTeamResultOverQuotaRetried(t *testing.T) {
	// A result of some 6 KB waits about 3 s of the rate once the budget is spent; the
	// instance heartbeats (a few hundred bytes a second) fit beside it.
	lim := intake.Limits{BytesPerSecond: 2000, Burst: 20_000}
	srv, svc := startTenants(t, map[string][]string{"alpha": {"flood"}}, lim)
	script := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(toolbus.ToolCall{CallID: "f1", Tool: "flood", Arguments: `{}`}), planner.Answer("done")}}
	p := testpipe.StartOn(t, eventstest.Connect(t, srv, "core"), 2*time.Minute, testpipe.ScriptByRun(map[string]*planner.Script{"quota-1": script}, nil))
	if _, err := provision.Consumer(p.Ctx, p.Bus, provision.ToolConsumerConfig("flood", 0, 0)); err != nil {
		t.Fatal(err)
	}
	spender := eventstest.Connect(t, srv, "alpha")
	var runs, drained atomic.Int32
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "flood", Description: "spends its team's budget, then answers", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			runs.Add(1)
			drained.Add(int32(drain(ctx, t, spender, events.SubjectToolLog("spend", "flood"))))
			return strings.Repeat("r", 6000), nil
		}}); err != nil {
		t.Fatal(err)
	}
	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	teamBus, err := events.Open(p.Ctx, eventstest.Connect(t, srv, "alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(log), executor.WithInstance("alpha-1")))
	w, err := worker.New(teamBus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: log, Grace: time.Second}, Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	p.Roles.Go("alpha-1", w.Run)
	p.WaitTools("flood")
	p.SubmitAs("quota-1", "alice", "go", toolbus.Limits{})
	p.WaitStatus("quota-1", toolbus.RunCompleted)

	if runs.Load() != 1 {
		t.Errorf("the tool ran %d times, want once", runs.Load())
	}
	if _, refused := svc.Counts(); refused <= uint64(drained.Load()) {
		t.Errorf("the write service refused %d writes, all of them the tool's own %d: the executor's were never refused", refused, drained.Load())
	}
	if !strings.Contains(logs.String(), `op="publish the result"`) || !strings.Contains(logs.String(), "quota_exceeded") {
		t.Errorf("the result was not refused over the quota and sent again; the executor logged:\n%s", logs.String())
	}
	evs, err := runlog.Events(p.Ctx, p.Bus, "quota-1")
	if err != nil {
		t.Fatal(err)
	}
	rep := audit.Analyze("quota-1", evs)
	if len(rep.Violations) > 0 {
		t.Fatalf("violations: %v", rep.Violations)
	}
	for _, c := range rep.Calls {
		if c.Result == nil || c.Result.Status != toolbus.StatusSucceeded || c.Result.Attempt != 1 {
			t.Errorf("call %s: %+v", c.CallID, c.Result)
		}
	}
}

// TestRefusedWriteNotRetried: a write of a call that the core's write service refuses
// for its form (400, here a roll-up) is refused again however often it is sent: the
// worker's in-place retry of a call's writes (two minutes for a bus failure or a 429)
// sends it once and returns the refusal, events.WriteRefusedForGood, which ends the call.
// The write service counts the attempts.
func TestRefusedWriteNotRetried(t *testing.T) {
	srv, svc := startTenants(t, map[string][]string{"alpha": {"calc"}}, intake.Limits{})
	ctx := eventstest.Context(t, time.Minute)
	core := eventstest.Connect(t, srv, "core")
	if _, _, err := provision.Setup(ctx, core, events.Config{}, provision.WithTools([]string{"calc"}, 0, 0)); err != nil {
		t.Fatal(err)
	}
	msg := oneMessage(ctx, t, core)
	alpha := eventstest.Connect(t, srv, "alpha")
	teamBus, err := events.Open(ctx, alpha, events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(alpha)
	if err != nil {
		t.Fatal(err)
	}
	reg := executor.NewRegistry()
	w, err := worker.New(teamBus, testutil.Must(executor.New(reg)), worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: testutil.Logger()}, Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error { // the service subscribes
		_, err := js.Publish(ctx, events.SubjectToolLog("r0", "calc"), []byte("ok"))
		return err
	})
	_, before := svc.Counts()
	// Well under the retry's two minutes: a retried 400 would be sent until it ends.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sent := 0
	err = w.RetryCallWrite(rctx, msg, func() error {
		sent++
		m := nats.NewMsg(events.SubjectToolLog("r1", "calc"))
		m.Header.Set("Nats-Rollup", "sub")
		_, err := js.PublishMsg(rctx, m)
		return events.WriteRefusal(err)
	})
	if !errors.Is(err, events.ErrWriteRefused) || !events.WriteRefusedForGood(err) {
		t.Fatalf("the refused write returned %v, want a refusal for good", err)
	}
	if _, after := svc.Counts(); sent != 1 || after-before != 1 {
		t.Errorf("the write refused for good was sent %d times (the service refused %d)", sent, after-before)
	}
}

// oneMessage returns a message of a work queue of the core account, to stand for the
// call whose writes are retried (the retry sends its heartbeats).
func oneMessage(ctx context.Context, t *testing.T, nc *nats.Conn) jetstream.Msg {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.1", []byte("call")); err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		return m
	}
	t.Fatal(fmt.Errorf("no message fetched: %v", batch.Error()))
	return nil
}

// TestLeaseRenewedUnderQuota: the renewal of an executor's lease (its instance record)
// refused over the team's bytes per second is sent again within its period, so a burst
// of the team's writes does not lapse the lease (three refused periods would hand every
// running call back): right after the team's budget is spent, the renewal passes once
// the rate has refilled its few hundred bytes. Nothing is exempt: the service refused it
// first.
func TestLeaseRenewedUnderQuota(t *testing.T) {
	srv, svc := startTenants(t, map[string][]string{"alpha": {"calc"}}, intake.Limits{BytesPerSecond: 500, Burst: 20_000})
	ctx := eventstest.Context(t, time.Minute)
	if _, _, err := provision.Setup(ctx, eventstest.Connect(t, srv, "core"), events.Config{}, provision.WithTools([]string{"calc"}, 0, 0)); err != nil {
		t.Fatal(err)
	}
	alpha := eventstest.Connect(t, srv, "alpha")
	teamBus, err := events.Open(ctx, alpha, events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(teamBus, testutil.Must(executor.New(executor.NewRegistry())),
		worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: testutil.Logger()}, Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	in := store.Instance{Team: "alpha", Name: "alpha-1", Boot: "b1", Tools: []string{"calc"}, Concurrency: 1}
	eventstest.Eventually(t, 10*time.Second, func() error { return w.Renew(ctx, in, 0) }) // the service subscribes
	drained := drain(ctx, t, eventstest.Connect(t, srv, "alpha"), events.SubjectToolLog("spend", "calc"))
	// The record's few hundred bytes take the rate most of a second to refill.
	if err := w.Renew(ctx, in, 5*time.Second); err != nil {
		t.Fatalf("the renewal right after the team's budget was spent: %v", err)
	}
	if _, refused := svc.Counts(); refused <= uint64(drained) {
		t.Errorf("the write service refused %d writes, all of them the spender's %d: the renewal was never refused", refused, drained)
	}
}

// TestSyncUnderQuota: a running worker whose tools change (a tool provider's list)
// records its instance's new tools even right after the team's budget is spent: the
// write refused over the quota is sent again, and Sync does not fail.
func TestSyncUnderQuota(t *testing.T) {
	srv, svc := startTenants(t, map[string][]string{"alpha": {"calc", "extra"}}, intake.Limits{BytesPerSecond: 500, Burst: 20_000})
	ctx := eventstest.Context(t, time.Minute)
	core, _, err := provision.Setup(ctx, eventstest.Connect(t, srv, "core"), events.Config{}, provision.WithTools([]string{"calc", "extra"}, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	teamBus, err := events.Open(ctx, eventstest.Connect(t, srv, "alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	reg := executor.NewRegistry()
	for _, name := range []string{"calc", "extra"} {
		if err := reg.Register(executor.Tool{Name: name, Description: "answers", InputSchema: json.RawMessage(`{"type":"object"}`),
			Func: func(context.Context, json.RawMessage) (any, error) { return "ok", nil }}); err != nil {
			t.Fatal(err)
		}
	}
	w := testutil.Must(worker.New(teamBus, testutil.Must(executor.New(reg)),
		worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: testutil.Logger(), Grace: time.Second}, Team: "alpha"}))
	runCtx, stop := context.WithCancel(ctx)
	ended := make(chan error, 1)
	go func() { ended <- w.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ended })
	tools := func() ([]string, error) {
		ins, err := core.Store().Instances(ctx)
		if err != nil {
			return nil, err
		}
		for _, in := range ins {
			if in.Name == "alpha-1" {
				return in.Tools, nil
			}
		}
		return nil, fmt.Errorf("no instance alpha-1 yet (instances %+v)", ins)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		got, err := tools()
		if err == nil && len(got) != 2 {
			err = fmt.Errorf("instance tools %v", got)
		}
		return err
	})

	// A removed tool writes nothing but the instance record: with the budget spent, that
	// write is the one refused.
	reg.Unregister("extra")
	drained := drain(ctx, t, eventstest.Connect(t, srv, "alpha"), events.SubjectToolLog("spend", "calc"))
	if err := w.Sync(ctx); err != nil {
		t.Fatalf("Sync right after the team's budget was spent: %v", err)
	}
	select {
	case err := <-ended:
		ended <- err // for the cleanup
		t.Fatalf("the worker ended: %v", err)
	default:
	}
	if _, refused := svc.Counts(); refused <= uint64(drained) {
		t.Errorf("the write service refused %d writes, all of them the spender's %d: the instance record was never refused", refused, drained)
	}
	if got, err := tools(); err != nil || len(got) != 1 || got[0] != "calc" {
		t.Fatalf("instance tools after Sync: %v %v, want [calc]", got, err)
	}
}
