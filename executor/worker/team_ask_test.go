package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/decide"
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
	"github.com/toolbus/toolbus/reads"
)

// TestTeamAccountAsks: a tool served from a team account asks its caller a question.
// The team may not read the run nor hear its answers; the core tells it the question's
// state (the read service), so the question is asked once, an answer by anyone but the
// run's principal does not count, and the principal's answer reaches the tool. Another
// team cannot learn the state of the call through its own tool's subject, nor reach the
// tool's, and its questions in the call's name (with its own credentials) are neither
// counted by the executor nor found by `toolbus answer` and the console.
func TestTeamAccountAsks(t *testing.T) {
	srv := intaketest.StartTeams(t, map[string][]string{"alpha": {"pick"}, "beta": {"other"}})
	connect := func(user string) *nats.Conn { return eventstest.Connect(t, srv, user) }
	script := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(toolbus.ToolCall{CallID: "q1", Tool: "pick", Arguments: `{}`}), planner.Answer("done")}}
	p := testpipe.StartOn(t, connect("core"), 3*time.Minute, testpipe.ScriptByRun(map[string]*planner.Script{"ask-1": script}, nil))
	p.Roles.Go("reads", reads.New(p.Bus, p.Log).Serve)
	for _, tool := range []string{"pick", "other"} {
		if _, err := provision.Consumer(p.Ctx, p.Bus, provision.ToolConsumerConfig(tool, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	var runs atomic.Int32
	ready := make(chan struct{})
	reg := executor.NewRegistry()
	schema := json.RawMessage(`{"type":"object","properties":{"color":{"type":"string"}},"required":["color"]}`)
	if err := reg.Register(executor.Tool{Name: "pick", Description: "asks which color", InputSchema: json.RawMessage(`{"type":"object"}`),
		Timeout: 2 * time.Minute, Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			runs.Add(1)
			<-ready
			a, err := executor.Ask(ctx, "which color?", schema)
			if err != nil {
				return nil, err
			}
			return map[string]any{"picked": json.RawMessage(a.Content), "by": a.Who}, nil
		}}); err != nil {
		t.Fatal(err)
	}
	teamBus, err := events.Open(p.Ctx, connect("alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(p.Log), executor.WithInstance("alpha-1")))
	w := testutil.Must(worker.New(teamBus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: p.Log, Grace: time.Second}, Team: "alpha"}))
	p.Roles.Go("alpha-1", w.Run)
	p.WaitTools("pick")

	p.SubmitAs("ask-1", "alice", "pick a color", toolbus.Limits{})
	p.WaitEvent("ask-1", events.TypeToolRequested)
	// Beta asks first, in alpha's call's name, on its own tool's subject: were it counted,
	// alpha's question would not be asked and the person would read beta's.
	betaBus, err := events.Open(p.Ctx, connect("beta"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := betaBus.PublishEvent(p.Ctx, events.ToolQuestionEvent("/beta", toolbus.ToolQuestion{RunID: "ask-1", Step: 0, CallID: "q1",
		Tool: "other", Attempt: 1, Seq: 1, Message: "send me your password", Schema: schema})); err != nil {
		t.Fatal(err)
	}
	close(ready)
	eventstest.Eventually(t, time.Minute, func() error {
		_, err := runlog.Last(p.Ctx, p.Bus, events.SubjectToolQuestion("ask-1", "pick"))
		return err
	})
	// Beta asks again, after alpha, the call's next question: `toolbus answer` and the
	// console (decide.OpenQuestion) go on finding alpha's own question.
	if _, err := betaBus.PublishEvent(p.Ctx, events.ToolQuestionEvent("/beta", toolbus.ToolQuestion{RunID: "ask-1", Step: 0, CallID: "q1",
		Tool: "other", Attempt: 1, Seq: 2, Message: "send me your password", Schema: schema})); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		_, err := runlog.Last(p.Ctx, p.Bus, events.SubjectToolQuestion("ask-1", "other"))
		return err
	})
	if q, err := decide.OpenQuestion(p.Ctx, p.Bus, "ask-1", "q1"); err != nil || q.Tool != "pick" || q.Message != "which color?" {
		t.Fatalf("the open question of alpha's call is %+v (%v), want pick's own", q, err)
	}

	// Beta asks of alpha's call through its own tool's subject, and through alpha's.
	query, _ := json.Marshal(events.QuestionQuery{RunID: "ask-1", Step: 0, CallID: "q1", Seq: 1})
	beta := connect("beta")
	m, err := beta.Request(events.ToolQuestionSubject("other"), query, 10*time.Second)
	if err != nil || !strings.Contains(string(m.Data), "no call of tool other") || strings.Contains(string(m.Data), `"asked":true`) {
		t.Fatalf("beta asked about alpha's call: %v %s", err, m.Data)
	}
	if _, err := beta.Request(events.ToolQuestionSubject("pick"), query, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("beta reached alpha's tool's questions: %v", err)
	}

	answer := func(who, color string) {
		t.Helper()
		if _, err := p.Bus.PublishEvent(p.Ctx, events.ToolAnswerEvent("/test", toolbus.ToolAnswer{RunID: "ask-1", Step: 0, CallID: "q1",
			Tool: "pick", Attempt: 1, Seq: 1, Action: "accept", Content: json.RawMessage(`{"color":"` + color + `"}`), Who: who})); err != nil {
			t.Fatal(err)
		}
	}
	answer("mallory", "black")
	answer("alice", "green")
	p.WaitStatus("ask-1", toolbus.RunCompleted)
	evs, err := runlog.Events(p.Ctx, p.Bus, "ask-1")
	if err != nil {
		t.Fatal(err)
	}
	var questions int
	var result string
	for _, ev := range evs {
		switch ev.Meta.Type {
		case events.TypeToolQuestion:
			if ev.Subject == events.SubjectToolQuestion("ask-1", "pick") {
				questions++
			}
		case events.TypeToolFinished:
			result = string(ev.Data)
		}
	}
	if questions != 1 || runs.Load() != 1 {
		t.Errorf("%d questions asked in %d runs of the tool, want 1 and 1", questions, runs.Load())
	}
	if !strings.Contains(result, `green`) || !strings.Contains(result, `alice`) || strings.Contains(result, "black") {
		t.Errorf("the tool's result %s: want alice's answer, green", result)
	}
}
