package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/planner"
)

// Message-id squatting: JetStream's duplicate window is keyed by Nats-Msg-Id across the
// whole stream, so a party could publish, on a subject it may use, a message carrying
// the id another role's event will carry. These tests pre-publish such a message for
// every id a run's events can have and check that every real event is still stored and
// the run ends as it would have.

// runIDs returns the id of every event a run of steps steps whose step-0 calls are
// calls can carry (every outcome at every step, every call event, approvals, the
// deadline timer, the cancellation), built by the constructors the workers use.
func runIDs(run string, steps int, calls ...string) []string {
	const src = "/toolbus/test/1"
	ids := []string{
		events.RunStartedEvent(src, toolbus.RunStarted{RunID: run}).Meta.ID,
		events.TimerEvent(src, events.RunTimer{RunID: run}).Meta.ID,
		events.CancelEvent(src, toolbus.Cancel{RunID: run}).Meta.ID,
	}
	for step := range steps {
		ids = append(ids,
			events.ModelRequestedEvent(src, toolbus.ModelRequested{RunID: run, Step: step}).Meta.ID,
			events.ModelRespondedEvent(src, toolbus.ModelResponded{RunID: run, Step: step}).Meta.ID)
		for _, st := range []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled} {
			ids = append(ids, events.RunEndedEvent(src, step, toolbus.RunEnded{RunID: run, Status: st}).Meta.ID)
		}
		for n := 1; n <= len(calls); n++ {
			ids = append(ids, events.RunEndedEvent(src, step, toolbus.RunEnded{RunID: run, Status: toolbus.RunWaitingForApproval,
				Pending: make([]toolbus.ToolCall, n)}).Meta.ID)
		}
		for _, c := range calls {
			tc := toolbus.ToolCall{CallID: c, Tool: "noop"}
			ids = append(ids,
				events.ToolRequestedEvent(src, toolbus.ToolRequested{RunID: run, Step: step, CallCount: 1, Call: tc}, true).Meta.ID,
				events.ToolRequestedEvent(src, toolbus.ToolRequested{RunID: run, Step: step, CallCount: 1, Call: tc, Approved: true}, true).Meta.ID,
				events.ToolFinishedEvent(src, toolbus.ToolFinished{RunID: run, Step: step, CallCount: 1, ToolResult: toolbus.ToolResult{CallID: c, Tool: "noop"}}).Meta.ID,
				events.ToolWaitingEvent(src, toolbus.ToolWaiting{RunID: run, Step: step, CallCount: 1, Call: tc}).Meta.ID,
				events.ApprovalEvent(src, step, toolbus.Approval{RunID: run, CallID: c}, true).Meta.ID,
				events.ApprovalEvent(src, step, toolbus.Approval{RunID: run, CallID: c}, false).Meta.ID)
		}
	}
	return ids
}

// squatAll publishes with js, for every id, a message carrying it as Nats-Msg-Id on one
// of subjects (in turn): subjects the squatting party may publish on. The body is not
// an event: consumers terminate it.
func squatAll(t *testing.T, ctx context.Context, js jetstream.JetStream, subjects []string, ids []string) {
	t.Helper()
	for i, id := range ids {
		m := nats.NewMsg(subjects[i%len(subjects)])
		m.Data = []byte("squat " + id)
		ack, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(id))
		if err != nil {
			t.Fatalf("squat %s on %s: %v", id, m.Subject, err)
		}
		if ack.Duplicate {
			t.Fatalf("squat %s on %s: the id was already taken", id, m.Subject)
		}
	}
}

// replayOf audits a run from its events as `toolbus replay` does.
func replayOf(t *testing.T, ctx context.Context, bus *events.Bus, run string) *audit.Report {
	t.Helper()
	evs, err := runlog.Events(ctx, bus, run)
	if err != nil {
		t.Fatal(err)
	}
	return audit.Analyze(run, evs)
}

// A client and an executor, each with the credentials deploy/nats ships
// (auth-users.conf), squat every id of a run's events on subjects they may publish on
// (a client: run.started, run.cancel, approvals of another run; an executor: results
// and waits of another run's tool) before the run starts. The run still completes
// with every event stored once, the deadline timer is armed, the replay (read with the
// client's credentials) sees it end with no violation, and neither party hit a
// permission violation: the squats were all allowed, and none suppressed anything.
func TestSquattingWithRoleCredentials(t *testing.T) {
	t.Parallel()
	pw, vars := newPasswords()
	srv := startConfigured(t, "auth-users.conf", vars)
	opts := map[string][]nats.Option{}
	for _, role := range allRoles {
		opts[role] = []nats.Option{nats.UserInfo(role, pw[role])}
	}
	s := startSecured(t, srv.ClientURL(), opts)
	client := s.buses["client"]
	before := events.SquatsSeen()
	squatters := []struct {
		role     string
		subjects []string
	}{
		{"client", []string{events.SubjectRunStarted("decoy-c", ""), events.SubjectRunCancel("decoy-c", ""),
			events.SubjectApproval("decoy-c", true, ""), events.SubjectApproval("decoy-c", false, "")}},
		{"executor", []string{events.SubjectToolFinished("decoy-e", "noop"), events.SubjectToolWaiting("decoy-e", "noop")}},
	}
	for _, sq := range squatters {
		t.Run(sq.role, func(t *testing.T) {
			run := "squat-by-" + sq.role
			js, err := jetstream.New(s.conns[sq.role])
			if err != nil {
				t.Fatal(err)
			}
			// secModel: step 0 calls a (noop) and b (calculator), step 1 answers.
			ids := runIDs(run, 2, "a", "b")
			squatAll(t, s.ctx, js, sq.subjects, ids)
			if err := client.StartRun(s.ctx, events.Source("cli", "sec"), toolbus.RunStarted{
				RunID: run, Principal: toolbus.Principal{ID: "sec-tester"},
				Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "2+3?"}},
				Limits:   toolbus.Limits{Deadline: time.Now().Add(5 * time.Minute).UTC()},
			}); err != nil {
				t.Fatalf("start the run whose ids are squatted: %v", err)
			}
			var rep *audit.Report
			eventstest.Eventually(t, 60*time.Second, func() error {
				rep = replayOf(t, s.ctx, client, run)
				if rep.Status != toolbus.RunCompleted {
					return fmt.Errorf("run %s is %s (violations %v)", run, rep.Status, s.viol.all())
				}
				return nil
			})
			if !rep.OK || rep.Answer != "done" || len(rep.Calls) != 2 {
				t.Fatalf("replay of %s: ok %v, answer %q, %d calls, violations %+v", run, rep.OK, rep.Answer, len(rep.Calls), rep.Violations)
			}
			for _, c := range rep.Calls {
				if c.Result == nil || c.Result.Status != toolbus.StatusSucceeded || c.Results != 1 || c.Requested != 1 {
					t.Fatalf("call %+v", c)
				}
			}
			evs, err := runlog.Events(s.ctx, client, run)
			if err != nil {
				t.Fatal(err)
			}
			for typ, want := range map[string]int{
				events.TypeRunStarted: 1, events.TypeModelRequested: 2, events.TypeModelResponded: 2, events.TypeToolRequested: 2,
				events.TypeToolFinished: 2, events.TypeRunEnded(toolbus.RunCompleted): 1,
			} {
				if got := countType(evs, typ); got != want {
					t.Errorf("%d %s event(s) stored, want %d", got, typ, want)
				}
			}
			// Its deadline is minutes away: a run that ends within half the injector's
			// acknowledgement wait gets no timer, a slower one gets one. A squatted timer
			// id that suppressed a needed timer is TestSquattingEveryOutcome's deadline run.
			if got := countType(evs, events.TypeRunTimer); got > 1 {
				t.Errorf("%d %s events stored, want at most 1", got, events.TypeRunTimer)
			}
			// The injector kept the young run's run.started (its deadline is minutes
			// away); with the injector role's credentials, the run's end acknowledged it.
			eventstest.Eventually(t, time.Minute, func() error {
				cons, err := s.buses["admin"].EventStream().Consumer(s.ctx, events.ConsumerInjectorStarted)
				if err != nil {
					return err
				}
				ci, err := cons.Info(s.ctx)
				if err != nil {
					return err
				}
				if ci.NumAckPending != 0 || ci.NumRedelivered != 0 {
					return fmt.Errorf("run.started: %d unacknowledged, %d redelivered", ci.NumAckPending, ci.NumRedelivered)
				}
				return nil
			})
		})
	}
	// Every event of both runs found its id taken (the workers run in this process).
	if seen := events.SquatsSeen() - before; seen < 2*10 {
		t.Errorf("%d squatted events seen, want at least 20 (10 events per run)", seen)
	}
	if v := s.viol.all(); len(v) > 0 {
		t.Fatalf("permission violations: %v", v)
	}
}

// The other ends of a run, with every id squatted first: a run that waits for
// approval and is granted, one that is cancelled while it waits, and one whose deadline
// passes while it waits (the injector's timed-out result and the limit_reached
// outcome). Each ends as it would have, and its replay sees it end.
func TestSquattingEveryOutcome(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "deploy", `{"service":"api"}`), call("b", "noop", `{}`)),
		planner.Answer("deployed"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	_, js := s.srv.Connect(t)
	subjects := []string{events.SubjectRunStarted("decoy", ""), events.SubjectApproval("decoy", true, ""),
		events.SubjectToolFinished("decoy", "noop"), events.SubjectToolWaiting("decoy", "deploy")}
	for _, run := range []string{"sq-granted", "sq-cancelled", "sq-deadline"} {
		squatAll(t, s.ctx, js, subjects, runIDs(run, 2, "a", "b"))
	}
	s.submit("sq-granted", toolbus.Limits{})
	s.submit("sq-cancelled", toolbus.Limits{})
	s.submit("sq-deadline", toolbus.Limits{Deadline: time.Now().Add(4 * time.Second).UTC()})
	for _, run := range []string{"sq-granted", "sq-cancelled", "sq-deadline"} {
		s.waitOutcome(run, "waiting for a", waitingFor("a"))
	}
	s.decide("sq-granted", "a", true, "ok")
	if _, err := s.bus.PublishCancel(s.ctx, "/test", toolbus.Cancel{RunID: "sq-cancelled", Reason: "changed my mind", Who: "alice"}); err != nil {
		t.Fatal(err)
	}
	for run, want := range map[string]toolbus.RunStatus{
		"sq-granted": toolbus.RunCompleted, "sq-cancelled": toolbus.RunCancelled, "sq-deadline": toolbus.RunLimitReached,
	} {
		ended := s.waitEnd(run, want)
		rep := replayOf(t, s.ctx, s.bus, run)
		if rep.Status != want || !rep.OK {
			t.Errorf("replay of %s: %s, violations %+v; want %s", run, rep.Status, rep.Violations, want)
		}
		if run == "sq-deadline" {
			res, ok := s.resultOf(run, 0, "a")
			if !ok || res.Status != toolbus.StatusTimedOut || len(ended.Unanswered) != 1 {
				t.Errorf("deadline: result of a %+v (%v), unanswered %v", res, ok, ended.Unanswered)
			}
		}
	}
	if n := deploy.total(); n != 1 {
		t.Fatalf("deploy ran %d times, want once (the granted run)", n)
	}
}

// mismatchTerminated waits until seq was terminated by consumer as a subject mismatch.
func mismatchTerminated(t *testing.T, tr *terminations, seq uint64, consumer string) {
	t.Helper()
	a := tr.wait(t, seq)
	if a.Consumer != consumer || !strings.Contains(a.Reason, "subject and body disagree") {
		t.Fatalf("message #%d terminated by %s (%q), want %s as a subject mismatch", seq, a.Consumer, a.Reason, consumer)
	}
}

// Subject and body agree, for every event type a worker consumes: each forgery below
// (published by a party allowed on its subject) is terminated by the consumer that
// receives it with the reason, changes nothing for the run it names, and shows in the
// replay of the run whose subject it is on as a subject_mismatch violation. The victim
// waits for approval of a deploy throughout; it then completes on the real approval,
// the deploy having run once.
func TestSubjectBodyMismatch(t *testing.T) {
	t.Parallel()
	deploy := newDeployTool()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "deploy", `{"service":"api"}`), call("b", "noop", `{}`)),
		planner.Answer("deployed"),
	}}
	s := newStack(t, model, deploy.tool())
	s.startAll()
	tr := watchTerminations(t, s.srv.Conn)
	s.submit("victim", toolbus.Limits{})
	s.submit("decoy", toolbus.Limits{})
	s.waitOutcome("victim", "waiting for a", waitingFor("a"))
	s.waitOutcome("decoy", "waiting for a", waitingFor("a"))
	const src = "/toolbus/evil/1"
	deployCall := call("a", "deploy", `{"service":"api"}`)
	forge := func(subject string, e events.Envelope) uint64 {
		t.Helper()
		ack, err := s.bus.Publish(s.ctx, subject, e.Meta, e.Data)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	type forgery struct {
		name     string
		subject  string
		e        events.Envelope
		consumer string
	}
	forgeries := []forgery{
		// The reported one: an approval for the victim's call under another run's subject.
		{"approval of another run", events.SubjectApproval("decoy", true, "mallory"),
			events.ApprovalEvent(src, 0, toolbus.Approval{RunID: "victim", CallID: "a", Who: "mallory"}, true), events.ConsumerInjectorApprovals},
		{"granted on the denied subject", events.SubjectApproval("decoy", false, "mallory"),
			events.ApprovalEvent(src, 0, toolbus.Approval{RunID: "decoy", CallID: "a", Who: "mallory"}, true), events.ConsumerInjectorApprovals},
		{"cancel of another run", events.SubjectRunCancel("decoy", "mallory"),
			events.CancelEvent(src, toolbus.Cancel{RunID: "victim", Who: "mallory"}), events.ConsumerInjectorCancel},
		{"result of another run's call", events.SubjectToolFinished("decoy", "deploy"),
			events.ToolFinishedEvent(src, toolbus.ToolFinished{RunID: "victim", Step: 0, CallIndex: 0, CallCount: 2,
				ToolResult: toolbus.ToolResult{CallID: "a", Tool: "deploy", Status: toolbus.StatusSucceeded, Content: "forged"}}), events.ConsumerInjector},
		{"result under another tool", events.SubjectToolFinished("decoy", "noop"),
			events.ToolFinishedEvent(src, toolbus.ToolFinished{RunID: "decoy", Step: 0, CallIndex: 0, CallCount: 2,
				ToolResult: toolbus.ToolResult{CallID: "a", Tool: "deploy", Status: toolbus.StatusSucceeded, Content: "forged"}}), events.ConsumerInjector},
		{"wait of another run", events.SubjectToolWaiting("decoy", "deploy"),
			events.ToolWaitingEvent(src, toolbus.ToolWaiting{RunID: "victim", Step: 0, CallIndex: 0, CallCount: 2, Call: deployCall}), events.ConsumerInjectorWaiting},
		{"run.started of another run", events.SubjectRunStarted("decoy-2", ""),
			events.RunStartedEvent(src, toolbus.RunStarted{RunID: "decoy-3", Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "x"}}}), events.ConsumerInjectorStarted},
		{"step request of another run", events.SubjectModelRequested("decoy"),
			events.ModelRequestedEvent(src, toolbus.ModelRequested{RunID: "victim", Step: 1}), events.ConsumerPlanner},
		{"deploy call on the noop queue", events.SubjectToolRequested("victim", "noop"),
			events.ToolRequestedEvent(src, toolbus.ToolRequested{RunID: "victim", Step: 0, CallIndex: 0, CallCount: 2, Call: deployCall}, true), events.ToolConsumer("noop")},
		{"call of another run", events.SubjectToolRequested("decoy", "deploy"),
			events.ToolRequestedEvent(src, toolbus.ToolRequested{RunID: "victim", Step: 0, CallIndex: 0, CallCount: 2, Call: deployCall, Approved: true}, true), events.ToolConsumer("deploy")},
		{"deadline timer of another run", events.SubjectTimer("decoy"),
			events.TimerEvent(src, events.RunTimer{RunID: "victim", Deadline: time.Now().Add(-time.Hour)}), events.ConsumerInjectorTimers},
	}
	onRun := map[string][]uint64{} // run -> sequences of the forgeries on its subjects
	for _, f := range forgeries {
		seq := forge(f.subject, f.e)
		mismatchTerminated(t, tr, seq, f.consumer)
		run, _ := events.RunIDFromSubject(f.subject)
		onRun[run] = append(onRun[run], seq)
		t.Logf("%s: #%d terminated by %s", f.name, seq, f.consumer)
	}
	// An outcome naming another run, which no consumer takes: readers ignore it.
	onRun["decoy"] = append(onRun["decoy"], forge(events.SubjectRunEnded("decoy", toolbus.RunCompleted),
		events.RunEndedEvent(src, 0, toolbus.RunEnded{RunID: "victim", Status: toolbus.RunCompleted, Answer: "forged"})))

	// Nothing happened to the victim or the decoy: both still wait, the deploy never ran,
	// decoy-2 never started.
	for _, run := range []string{"victim", "decoy"} {
		st, _, err := s.bus.Store().RunState(s.ctx, run)
		if err != nil || st.Status != toolbus.RunWaitingForApproval {
			t.Fatalf("run %s: %s, %v; want still waiting", run, st.Status, err)
		}
		if outs := s.outcomes(run); len(outs) != 1 || outs[0].Status != toolbus.RunWaitingForApproval {
			t.Fatalf("run %s outcomes %+v", run, outs)
		}
	}
	if _, _, err := s.bus.Store().RunState(s.ctx, "decoy-2"); !errors.Is(err, events.ErrRunNotFound) {
		t.Fatalf("decoy-2 has a run state: %v", err)
	}
	if n := deploy.total(); n != 0 {
		t.Fatalf("the deploy ran %d times on forgeries", n)
	}
	// The replays flag each forgery on their subjects, and only them.
	for run, seqs := range onRun {
		rep := replayOf(t, s.ctx, s.bus, run)
		var got []uint64
		for _, v := range rep.Violations {
			if run == "decoy-2" && v.Code == audit.ViolationNoRunStarted {
				continue // its only run.started names another run: it never started
			}
			if v.Code != audit.ViolationSubjectMismatch {
				t.Errorf("replay of %s: unexpected violation %+v", run, v)
				continue
			}
			got = append(got, v.Seq)
		}
		slices.Sort(seqs)
		if !slices.Equal(got, seqs) {
			t.Errorf("replay of %s flags %v, want the forgeries %v", run, got, seqs)
		}
		if run == "decoy" && rep.Status != toolbus.RunWaitingForApproval {
			t.Errorf("replay of decoy: status %s (a forged outcome counted)", rep.Status)
		}
	}
	// The real approval still works.
	s.decide("victim", "a", true, "ok")
	s.waitEnd("victim", toolbus.RunCompleted)
	if n := deploy.total(); n != 1 {
		t.Fatalf("the deploy ran %d times, want once", n)
	}
}
