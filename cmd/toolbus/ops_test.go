package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// opsPipeline is a whole pipeline on an embedded server, driven through run() as the
// toolbus binary is, with TOOLBUS_NATS_URL pointing at the server.
type opsPipeline struct {
	*testpipe.Pipeline
	t   *testing.T
	ctx context.Context
	srv *eventstest.Bus
	bus *events.Bus

	mu   sync.Mutex
	reqs map[string][]planner.Request
}

// opsPipelineDeadline bounds a pipeline's life (its workers stop then); a load test
// raises it. No test of this package runs in parallel.
var opsPipelineDeadline = 3 * time.Minute

func startOpsPipeline(t *testing.T, scripts map[string]*planner.Script, extra ...executor.Tool) *opsPipeline {
	t.Helper()
	p := &opsPipeline{t: t, reqs: map[string][]planner.Request{}}
	tp := testpipe.Start(t, opsPipelineDeadline, testpipe.ScriptByRun(scripts, func(req planner.Request) {
		p.mu.Lock()
		p.reqs[req.RunID] = append(p.reqs[req.RunID], req)
		p.mu.Unlock()
	}), extra...)
	p.Pipeline, p.ctx, p.srv, p.bus = tp, tp.Ctx, tp.Srv, tp.Bus
	t.Setenv("TOOLBUS_NATS_URL", tp.Srv.URL)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	t.Setenv("USER", "carol")
	return p
}

// toolbus runs the command line in this process.
func (p *opsPipeline) toolbus(args ...string) (code int, stdout, stderr string) {
	return p.toolbusCtx(p.ctx, args...)
}

func (p *opsPipeline) toolbusCtx(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func (p *opsPipeline) submit(run string, limits toolbus.Limits) {
	p.t.Helper()
	p.SubmitAs(run, "tester", "question for "+run, limits)
}

func (p *opsPipeline) waitStatus(run string, want toolbus.RunStatus) {
	p.t.Helper()
	p.WaitStatus(run, want)
}

// waitEvent waits until the run has an event of type typ.
func (p *opsPipeline) waitEvent(run, typ string) { p.t.Helper(); p.WaitEvent(run, typ) }

// waitFollowing waits until tail says on stderr that it follows (line): events stored
// after that are all shown.
func (p *opsPipeline) waitFollowing(errOut *testutil.Buffer, line string) {
	p.t.Helper()
	eventstest.Eventually(p.t, 10*time.Second, func() error {
		if !strings.Contains(errOut.String(), line) {
			return fmt.Errorf("tail does not follow yet: %q", errOut.String())
		}
		return nil
	})
}

func (p *opsPipeline) lastRequest(run string) planner.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	reqs := p.reqs[run]
	if len(reqs) == 0 {
		p.t.Fatalf("the model was never asked for %s", run)
	}
	return reqs[len(reqs)-1]
}

func wantCode(t *testing.T, what string, code, want int, stdout, stderr string) {
	t.Helper()
	if code != want {
		t.Fatalf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", what, code, want, stdout, stderr)
	}
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Fatalf("%s: output lacks %q:\n%s", what, w, got)
		}
	}
}

func deployForOps() executor.Tool {
	return executor.Tool{
		Name: "deploy", Description: "deploys a service (needs approval)", NeedsApproval: true,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"service":{"type":"string"}}}`),
		Func: func(_ context.Context, args json.RawMessage) (any, error) {
			var in struct{ Service string }
			_ = json.Unmarshal(args, &in)
			return map[string]string{"deployed": in.Service}, nil
		},
	}
}

func opsCall(id, tool, args string) toolbus.ToolCall {
	return toolbus.ToolCall{CallID: id, Tool: tool, Arguments: args}
}

// TestOpsCommands drives approve, deny, cancel, runs, tail and replay through run()
// against a live pipeline.
func TestOpsCommands(t *testing.T) {
	scripts := map[string]*planner.Script{
		"ops-approve": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(opsCall("a", "noop", `{}`), opsCall("b", "deploy", `{"service":"api"}`)),
			planner.Answer("deployed"),
		}},
		"ops-deny": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(opsCall("b", "deploy", `{"service":"db"}`)),
			func(req planner.Request) planner.Response {
				return planner.Answer("not deployed: " + req.Messages[len(req.Messages)-1].Content)(req)
			},
		}},
		"ops-cancel": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(opsCall("s", "sleep", `{"ms":60000}`)),
			planner.Answer("unreachable"),
		}},
		"ops-live":     {Steps: []func(planner.Request) planner.Response{planner.Answer("hello")}},
		"ops-live-all": {Steps: []func(planner.Request) planner.Response{planner.Answer("hello")}},
	}
	p := startOpsPipeline(t, scripts, deployForOps())

	t.Run("approve", func(t *testing.T) {
		p.submit("ops-approve", toolbus.Limits{})
		p.waitStatus("ops-approve", toolbus.RunWaitingForApproval)

		code, out, errOut := p.toolbus("approve", "ops-approve", "nope")
		wantCode(t, "approve an unknown call", code, 1, out, errOut)
		wantContains(t, "approve an unknown call", errOut, "call nope of run ops-approve does not wait for approval", "waiting: b")
		code, out, errOut = p.toolbus("deny", "ops-approve", "b")
		wantCode(t, "deny without a reason", code, 2, out, errOut)
		wantContains(t, "deny without a reason", errOut, "--reason is required")
		code, out, errOut = p.toolbus("approve", "no-such-run", "b")
		wantCode(t, "approve in an unknown run", code, 1, out, errOut)

		code, out, errOut = p.toolbus("runs")
		wantCode(t, "runs", code, 0, out, errOut)
		wantContains(t, "runs", out, "RUN", "ops-approve", "waiting_for_approval", "1 call(s) need approval")

		code, out, errOut = p.toolbus("approve", "ops-approve", "b", "--reason", "CHG-42")
		wantCode(t, "approve", code, 0, out, errOut)
		wantContains(t, "approve", out, `approved call b deploy({"service":"api"}) of run ops-approve, step 0, by carol: CHG-42`)
		// carol is not the run's principal: the CLI says the decision stands only where
		// the injector's decision policy lists her (this injector lets anyone).
		wantContains(t, "approve", errOut, "note: carol is neither the principal (tester) of run ops-approve nor one of its approvers", "TOOLBUS_DECIDERS")
		p.waitStatus("ops-approve", toolbus.RunCompleted)

		code, out, errOut = p.toolbus("approve", "ops-approve", "b")
		wantCode(t, "approve again", code, 1, out, errOut)
		wantContains(t, "approve again", errOut, "run ops-approve already ended: completed")

		code, out, errOut = p.toolbus("replay", "ops-approve")
		wantCode(t, "replay", code, 0, out, errOut)
		wantContains(t, "replay", out, "run ops-approve: completed after 2 step(s)",
			"tool.waiting b deploy: waits for approval (not run)",
			"approval.granted b deploy: approval granted by carol: CHG-42",
			"tool.requested b deploy: requested again after the decision",
			`tool b deploy: {"deployed":"api"}`, "invariants: ok")

		// The transcript rebuilt from the stream is exactly what the model was sent,
		// followed by its answer.
		code, out, errOut = p.toolbus("replay", "--json", "ops-approve")
		wantCode(t, "replay --json", code, 0, out, errOut)
		var r audit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		last := p.lastRequest("ops-approve")
		want := append(append([]toolbus.Message(nil), last.Messages...), toolbus.Message{Role: toolbus.RoleAssistant, Content: "deployed"})
		if g, w := mustJSON(t, r.Transcript), mustJSON(t, want); g != w {
			t.Fatalf("transcript\n%s\nwant what the model was sent\n%s", g, w)
		}
		if !r.OK || r.Status != toolbus.RunCompleted || len(r.Calls) != 2 || r.Calls[1].Decision != "granted" || r.Calls[1].DecidedBy != "carol" {
			t.Fatalf("report %+v", r)
		}
	})

	t.Run("deny", func(t *testing.T) {
		p.submit("ops-deny", toolbus.Limits{})
		p.waitStatus("ops-deny", toolbus.RunWaitingForApproval)
		code, out, errOut := p.toolbus("deny", "ops-deny", "b", "--reason", "freeze until Monday", "--who", "dave")
		wantCode(t, "deny", code, 0, out, errOut)
		wantContains(t, "deny", out, `denied call b deploy({"service":"db"}) of run ops-deny, step 0, by dave: freeze until Monday`)
		p.waitStatus("ops-deny", toolbus.RunCompleted)
		code, out, errOut = p.toolbus("replay", "ops-deny", "--json")
		wantCode(t, "replay", code, 0, out, errOut)
		var r audit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		res := r.Calls[0].Result
		if res == nil || res.Status != toolbus.StatusRejected || res.Code() != toolbus.CodeApprovalDenied || r.Calls[0].DecidedBy != "dave" {
			t.Fatalf("denied call %+v", r.Calls[0])
		}
		if !strings.Contains(r.Answer, "approval_denied") || !strings.Contains(r.Answer, "freeze until Monday") {
			t.Fatalf("the model did not read the denial: %q", r.Answer)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		p.submit("ops-cancel", toolbus.Limits{})
		p.waitEvent("ops-cancel", events.TypeToolRequested)
		code, out, errOut := p.toolbus("cancel", "ops-cancel", "--reason", "wrong run")
		wantCode(t, "cancel", code, 0, out, errOut)
		wantContains(t, "cancel", out, "cancel requested for run ops-cancel (running): wrong run")
		p.waitStatus("ops-cancel", toolbus.RunCancelled)
		code, out, errOut = p.toolbus("cancel", "ops-cancel")
		wantCode(t, "cancel again", code, 1, out, errOut)
		wantContains(t, "cancel again", errOut, "already ended: cancelled")
		p.waitEvent("ops-cancel", events.TypeToolFinished)

		code, out, errOut = p.toolbus("replay", "ops-cancel", "--json")
		wantCode(t, "replay", code, 0, out, errOut)
		var r audit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if r.Status != toolbus.RunCancelled || r.Reason != "wrong run (by carol)" || len(r.Requests) != 1 {
			t.Fatalf("report status %s reason %q requests %+v", r.Status, r.Reason, r.Requests)
		}
		if res := r.Calls[0].Result; res == nil || res.Status != toolbus.StatusCancelled {
			t.Fatalf("the sleep call: %+v", r.Calls[0])
		}
	})

	t.Run("runs", func(t *testing.T) {
		code, out, errOut := p.toolbus("runs", "--json")
		wantCode(t, "runs --json", code, 0, out, errOut)
		var rows []struct {
			RunID  string         `json:"run_id"`
			Status string         `json:"status"`
			AgeMS  int64          `json:"age_ms"`
			Calls  map[string]int `json:"calls"`
		}
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatal(err)
		}
		got, calls := map[string]string{}, map[string]map[string]int{}
		for _, r := range rows {
			got[r.RunID], calls[r.RunID] = r.Status, r.Calls
			if r.AgeMS < 0 {
				t.Fatalf("negative age %+v", r)
			}
		}
		if got["ops-approve"] != "completed" || got["ops-deny"] != "completed" || got["ops-cancel"] != "cancelled" {
			t.Fatalf("runs %v", got)
		}
		// A run that completed says how its calls ended: the denied deploy was rejected.
		if !maps.Equal(calls["ops-deny"], map[string]int{"rejected": 1}) || !maps.Equal(calls["ops-approve"], map[string]int{"succeeded": 2}) ||
			!maps.Equal(calls["ops-cancel"], map[string]int{"cancelled": 1}) {
			t.Fatalf("runs --json calls %v", calls)
		}
		code, out, errOut = p.toolbus("runs")
		wantCode(t, "runs", code, 0, out, errOut)
		if !regexp.MustCompile(`(?m)^ops-deny\s+completed\s+\d+\s+1 call: 1 rejected\s`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^ops-approve\s+completed\s+\d+\s+2 calls\s`).MatchString(out) {
			t.Fatalf("runs does not show the calls that did not succeed:\n%s", out)
		}
		code, out, errOut = p.toolbus("runs", "--status", "cancelled")
		wantCode(t, "runs --status", code, 0, out, errOut)
		if strings.Contains(out, "ops-approve") || !strings.Contains(out, "ops-cancel") {
			t.Fatalf("runs --status cancelled:\n%s", out)
		}
	})

	t.Run("tail", func(t *testing.T) {
		code, out, errOut := p.toolbus("tail", "--all", "ops-approve")
		wantCode(t, "tail --all", code, 0, out, errOut)
		wantContains(t, "tail --all", out, "run ops-approve started", ".. b deploy waits for approval", "run ops-approve: completed")
		if strings.Contains(out, "\x1b[") {
			t.Fatalf("colour in a pipe:\n%q", out)
		}
		code, out, errOut = p.toolbus("tail", "--all", "--color", "always", "ops-approve")
		wantCode(t, "tail --color always", code, 0, out, errOut)
		wantContains(t, "tail --color always", out, "\x1b[1m\x1b[32m"+"run ops-approve: completed")

		code, out, errOut = p.toolbus("tail", "ops-approve")
		wantCode(t, "tail of an ended run", code, 0, out, errOut)
		wantContains(t, "tail of an ended run", out, "already ended: completed")

		// Follow one run from before it starts, until it ends.
		var live, liveErr testutil.Buffer
		done := make(chan int, 1)
		go func() { done <- run(p.ctx, []string{"tail", "ops-live"}, &live, &liveErr) }()
		p.waitFollowing(&liveErr, "run ops-live not started yet")
		p.submit("ops-live", toolbus.Limits{})
		select {
		case code := <-done:
			wantCode(t, "tail ops-live", code, 0, live.String(), "")
		case <-p.ctx.Done():
			t.Fatal("tail did not stop at the end of the run")
		}
		wantContains(t, "tail ops-live", live.String(), "run ops-live started", "run ops-live: completed", "answer: hello")

		// Follow every run: new events only, each line prefixed with its run.
		var all, allErr testutil.Buffer
		tctx, stop := context.WithCancel(p.ctx)
		defer stop()
		go func() { done <- run(tctx, []string{"tail"}, &all, &allErr) }()
		p.waitFollowing(&allErr, "following every run from now on")
		p.submit("ops-live-all", toolbus.Limits{})
		eventstest.Eventually(t, 30*time.Second, func() error {
			if !strings.Contains(all.String(), "ops-live-all run ops-live-all: completed") {
				return fmt.Errorf("not yet:\n%s", all.String())
			}
			return nil
		})
		stop()
		if code := <-done; code != 0 {
			t.Fatalf("tail exit %d after interrupt", code)
		}
		if strings.Contains(all.String(), "ops-approve") {
			t.Fatalf("tail without --all printed old events:\n%s", all.String())
		}
	})

	t.Run("replay finds violations", func(t *testing.T) {
		code, out, errOut := p.toolbus("replay", "no-such-run")
		wantCode(t, "replay of an unknown run", code, 1, out, errOut)
		wantContains(t, "replay of an unknown run", errOut, "run no-such-run not found")

		// A second result for a call that already has one (another id, so the stream
		// keeps it): the audit must catch it.
		dup := toolbus.ToolFinished{RunID: "ops-approve", Step: 0, CallIndex: 0, CallCount: 2,
			ToolResult: toolbus.ToolResult{CallID: "a", Tool: "noop", Status: toolbus.StatusSucceeded, Content: "{}"}}
		if _, err := p.bus.Publish(p.ctx, events.SubjectToolFinished("ops-approve", "noop"), events.Meta{
			ID: "forged-1", Type: events.TypeToolFinished, Source: "/test", RunID: "ops-approve", CallID: "a", CallCount: 2,
		}, dup); err != nil {
			t.Fatal(err)
		}
		code, out, errOut = p.toolbus("replay", "ops-approve")
		wantCode(t, "replay of a broken run", code, 1, out, errOut)
		wantContains(t, "replay of a broken run", out, "invariants: 1 violation(s)", "duplicate_result")
		wantContains(t, "replay of a broken run", errOut, "breaks 1 invariant(s)")
	})
}
