package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/planner"
)

// sideEffects counts a tool's runs per idempotency key and the arguments each ran with.
type sideEffects struct {
	mu   sync.Mutex
	runs map[string][]string // idempotency key -> arguments of each run
}

func (s *sideEffects) add(key, args string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs == nil {
		s.runs = map[string][]string{}
	}
	s.runs[key] = append(s.runs[key], args)
	return len(s.runs[key])
}

func (s *sideEffects) of(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.runs[key]...)
}

// strictDeploy needs approval and takes exactly {"service": string}, so an edit can be
// invalid.
func strictDeploy(se *sideEffects) executor.Tool {
	return executor.Tool{
		Name: "deploy", Description: "deploys a service (needs approval)", NeedsApproval: true,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"service":{"type":"string"}},"required":["service"],"additionalProperties":false}`),
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			se.add(ci.IdempotencyKey, string(args))
			var in struct{ Service string }
			_ = json.Unmarshal(args, &in)
			return map[string]string{"deployed": in.Service}, nil
		},
	}
}

// flakyTool fails with a retryable upstream_busy on its first two runs of a call and
// succeeds on the third; its policy retries upstream_busy up to 3 attempts.
func flakyTool(se *sideEffects) executor.Tool {
	return executor.Tool{
		Name: "flaky", Description: "an upstream that is busy at first",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Retry:       &toolbus.RetryPolicy{MaxAttempts: 3, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Codes: []string{"upstream_busy"}},
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			if n := se.add(ci.IdempotencyKey, string(args)); n < 3 {
				return nil, executor.NewRetryableError("upstream_busy", "the upstream is busy, try again")
			}
			return map[string]string{"status": "done"}, nil
		},
	}
}

// echoLast answers with what the model read last: the content of the last message.
func echoLast(req planner.Request) planner.Response {
	return planner.Answer("read: " + req.Messages[len(req.Messages)-1].Content)(req)
}

func replayReport(t *testing.T, p *opsPipeline, run string) audit.Report {
	t.Helper()
	code, out, errOut := p.toolbus("replay", "--json", run)
	wantCode(t, "replay --json "+run, code, 0, out, errOut)
	var r audit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestHumanDecisions drives the four decisions of a person (approve, edit, reject,
// respond) and the refusals (an edit the tool's schema refuses, a call of another step,
// a call of an ended run) through the command line against a live pipeline, and checks
// the audit and what the model read.
func TestHumanDecisions(t *testing.T) {
	var deploys sideEffects
	two := func() *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(opsCall("b", "deploy", `{"service":"api"}`)), echoLast,
		}}
	}
	scripts := map[string]*planner.Script{"hd-edit": two(), "hd-reject": two(), "hd-respond": two()}
	p := startOpsPipeline(t, scripts, strictDeploy(&deploys))

	t.Run("edit", func(t *testing.T) {
		p.submit("hd-edit", toolbus.Limits{})
		p.waitStatus("hd-edit", toolbus.RunWaitingForApproval)

		// An edit the schema refuses: a clear error, nothing published, the call still waits.
		code, out, errOut := p.toolbus("approve", "hd-edit", "b", "--args", `{"service":42}`)
		wantCode(t, "invalid edit", code, 1, out, errOut)
		wantContains(t, "invalid edit", errOut, "edit of call b deploy refused", "nothing was published, the call still waits")
		code, out, errOut = p.toolbus("approve", "hd-edit", "b", "--args", `{"service":"web"`)
		wantCode(t, "edit that is not JSON", code, 1, out, errOut)
		wantContains(t, "edit that is not JSON", errOut, "not valid JSON")
		// A call of another step than the run's current one.
		code, out, errOut = p.toolbus("approve", "hd-edit", "b", "--step", "1", "--args", `{"service":"web"}`)
		wantCode(t, "edit of another step", code, 1, out, errOut)
		wantContains(t, "edit of another step", errOut, "step 1 is not the run's current step (0)")
		if n := countEvents(t, p, "hd-edit", events.TypeApprovalGranted); n != 0 {
			t.Fatalf("%d approval.granted published by refused edits", n)
		}
		if _, err := p.bus.Store().StepDecision(p.ctx, "hd-edit", 0, "b"); err == nil {
			t.Fatal("a refused edit was recorded as the decision")
		}
		if st, _, _ := p.bus.Store().RunState(p.ctx, "hd-edit"); st.Status != toolbus.RunWaitingForApproval {
			t.Fatalf("run is %s after refused edits, want it still waiting", st.Status)
		}

		code, out, errOut = p.toolbus("approve", "hd-edit", "b", "--step", "0", "--args", `{"service":"web"}`, "--who", "erin", "--reason", "api is frozen")
		wantCode(t, "edit", code, 0, out, errOut)
		wantContains(t, "edit", out, `approved with edited arguments call b deploy({"service":"api"}) of run hd-edit, step 0, by erin`)
		p.waitStatus("hd-edit", toolbus.RunCompleted)

		if runs := deploys.of("hd-edit/0/b"); len(runs) != 1 || runs[0] != `{"service":"web"}` {
			t.Fatalf("deploy ran %q, want once with the person's arguments", runs)
		}
		read := p.lastRequest("hd-edit").Messages
		if got := read[len(read)-1].Content; !strings.Contains(got, `a person (erin) edited the arguments of this call; it ran with {"service":"web"}`) ||
			!strings.Contains(got, `{"deployed":"web"}`) {
			t.Fatalf("the model read %q", got)
		}
		r := replayReport(t, p, "hd-edit")
		c := r.Calls[0]
		if c.Arguments != `{"service":"api"}` || c.EditedArguments != `{"service":"web"}` || c.DecidedBy != "erin" ||
			c.DecisionKind != toolbus.DecisionEdited || c.Result == nil || c.Result.Human == nil ||
			c.Result.Human.Who != "erin" || c.Result.Human.Arguments != `{"service":"web"}` {
			t.Fatalf("audit of the edited call %+v (result %+v)", c, c.Result)
		}
		// The run ended: an edit now is refused.
		code, out, errOut = p.toolbus("approve", "hd-edit", "b", "--args", `{"service":"db"}`)
		wantCode(t, "edit of an ended run", code, 1, out, errOut)
		wantContains(t, "edit of an ended run", errOut, "run hd-edit already ended: completed")
	})

	t.Run("reject", func(t *testing.T) {
		p.submit("hd-reject", toolbus.Limits{})
		p.waitStatus("hd-reject", toolbus.RunWaitingForApproval)
		code, out, errOut := p.toolbus("deny", "hd-reject", "b", "--message", "use the staging cluster instead", "--who", "dave")
		wantCode(t, "deny --message", code, 0, out, errOut)
		p.waitStatus("hd-reject", toolbus.RunCompleted)
		if runs := deploys.of("hd-reject/0/b"); len(runs) != 0 {
			t.Fatalf("a rejected deploy ran %d times", len(runs))
		}
		read := p.lastRequest("hd-reject").Messages
		if got := read[len(read)-1].Content; !strings.Contains(got, "approval_denied") || !strings.Contains(got, "use the staging cluster instead") {
			t.Fatalf("the model read %q", got)
		}
		c := replayReport(t, p, "hd-reject").Calls[0]
		if c.DecisionKind != toolbus.DecisionRejected || c.DecidedBy != "dave" || c.Result.Code() != toolbus.CodeApprovalDenied {
			t.Fatalf("audit of the rejected call %+v", c)
		}
	})

	t.Run("respond", func(t *testing.T) {
		p.submit("hd-respond", toolbus.Limits{})
		p.waitStatus("hd-respond", toolbus.RunWaitingForApproval)
		code, out, errOut := p.toolbus("respond", "hd-respond", "b")
		wantCode(t, "respond without an answer", code, 2, out, errOut)
		code, out, errOut = p.toolbus("respond", "hd-respond", "b", "--answer", "already deployed by hand at 10:02", "--who", "frank")
		wantCode(t, "respond", code, 0, out, errOut)
		wantContains(t, "respond", out, "answered in the tool's place call b deploy")
		p.waitStatus("hd-respond", toolbus.RunCompleted)
		if runs := deploys.of("hd-respond/0/b"); len(runs) != 0 {
			t.Fatalf("a deploy answered by a person ran %d times", len(runs))
		}
		read := p.lastRequest("hd-respond").Messages
		if got := read[len(read)-1].Content; !strings.Contains(got, "answered by a person (frank) in place of the tool") ||
			!strings.Contains(got, "already deployed by hand at 10:02") {
			t.Fatalf("the model read %q", got)
		}
		c := replayReport(t, p, "hd-respond").Calls[0]
		if c.DecisionKind != toolbus.DecisionResponded || c.Response != "already deployed by hand at 10:02" || c.Result == nil ||
			c.Result.Status != toolbus.StatusSucceeded || c.Result.Human == nil || c.Result.Human.Kind != toolbus.DecisionResponded {
			t.Fatalf("audit of the answered call %+v (result %+v)", c, c.Result)
		}
		code, out, errOut = p.toolbus("replay", "hd-respond")
		wantCode(t, "replay", code, 0, out, errOut)
		wantContains(t, "replay", out, "answered in the tool's place by frank: already deployed by hand at 10:02")
	})
}

// TestRetryPolicyFromTheCLI runs a flaky tool whose policy retries it: the fleet runs
// it three times with the same idempotency key, the model reads only the success, and
// `toolbus run`'s timeline and the audit show each failed attempt.
func TestRetryPolicyFromTheCLI(t *testing.T) {
	var calls sideEffects
	scripts := map[string]*planner.Script{"rp-flaky": {Steps: []func(planner.Request) planner.Response{
		planner.Calls(opsCall("f", "flaky", `{}`)), echoLast,
	}}}
	p := startOpsPipeline(t, scripts, flakyTool(&calls))
	p.submit("rp-flaky", toolbus.Limits{Deadline: time.Now().Add(2 * time.Minute)})
	p.waitStatus("rp-flaky", toolbus.RunCompleted)

	if runs := calls.of("rp-flaky/0/f"); len(runs) != 3 {
		t.Fatalf("flaky ran %d times with the call's idempotency key, want 3 (2 failed, 1 succeeded)", len(runs))
	}
	if n := countEvents(t, p, "rp-flaky", events.TypeToolFinished); n != 1 {
		t.Fatalf("%d tool.finished, want exactly one", n)
	}
	read := p.lastRequest("rp-flaky").Messages
	if got := read[len(read)-1].Content; got != `{"status":"done"}` {
		t.Fatalf("the model read %q, want only the final result", got)
	}
	r := replayReport(t, p, "rp-flaky")
	res := r.Calls[0].Result
	if res == nil || res.Status != toolbus.StatusSucceeded || res.Attempt != 3 || len(res.Retries) != 2 {
		t.Fatalf("final result %+v", res)
	}
	for i, fa := range res.Retries {
		if fa.Attempt != i+1 || fa.Error.Code != "upstream_busy" || fa.RetryAfterMS < 25 || fa.RetryAfterMS > 200 {
			t.Fatalf("failed attempt %d recorded as %+v", i+1, fa)
		}
	}
	code, out, errOut := p.toolbus("replay", "rp-flaky")
	wantCode(t, "replay", code, 0, out, errOut)
	wantContains(t, "replay", out, "after failed attempts retried by the tool's policy: #1 upstream_busy on exec-1", "#2 upstream_busy")
	code, out, errOut = p.toolbus("tail", "--all", "rp-flaky")
	wantCode(t, "tail", code, 0, out, errOut)
	wantContains(t, "tail", out, "<- f flaky: attempt 1 failed upstream_busy", "<- f flaky: attempt 2 failed upstream_busy", "<- f flaky: succeeded")
}

// TestRetryPolicyRefusesNonsense: a policy out of range is refused at registration,
// naming the field, and the registry keeps no trace of the tool.
func TestRetryPolicyRefusesNonsense(t *testing.T) {
	for _, tc := range []struct {
		p    toolbus.RetryPolicy
		want string
	}{
		{toolbus.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Second, MaxBackoff: time.Second}, "max_attempts 1"},
		{toolbus.RetryPolicy{MaxAttempts: 1000, InitialBackoff: time.Second, MaxBackoff: time.Second}, "max_attempts 1000"},
		{toolbus.RetryPolicy{MaxAttempts: 3, InitialBackoff: 0, MaxBackoff: time.Second}, "initial_backoff 0s"},
		{toolbus.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, MaxBackoff: time.Millisecond}, "max_backoff 1ms: want at least initial_backoff"},
		{toolbus.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, MaxBackoff: 48 * time.Hour}, "max_backoff 48h0m0s: want at most"},
		{toolbus.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, MaxBackoff: time.Second, Codes: []string{""}}, `codes: "" is not an error code`},
	} {
		reg := executor.NewRegistry()
		tool := flakyTool(&sideEffects{})
		tool.Retry = &tc.p
		err := reg.Register(tool)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"flaky"`) {
			t.Errorf("Register with %+v: %v, want an error naming %q", tc.p, err, tc.want)
		}
		if _, ok := reg.Lookup("flaky"); ok {
			t.Errorf("a tool with policy %+v was registered", tc.p)
		}
	}
}

func countEvents(t *testing.T, p *opsPipeline, run, typ string) int {
	t.Helper()
	evs, err := runlog.Events(p.ctx, p.bus, run)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Meta.Type == typ {
			n++
		}
	}
	return n
}
