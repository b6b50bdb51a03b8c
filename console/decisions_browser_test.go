package console

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/planner"
)

// flakyCounter counts the runs of the flaky tool per call, so the test sees the side
// effects the retries had, not only the results.
type flakyCounter struct {
	mu   sync.Mutex
	runs map[string]int
}

func (f *flakyCounter) add(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs[key]++
	return f.runs[key]
}

// flakyTool fails twice with a retryable upstream_busy and succeeds on its third run;
// its policy retries upstream_busy up to 3 attempts.
func flakyTool(f *flakyCounter) executor.Tool {
	return executor.Tool{
		Name: "flaky", Description: "an upstream that is busy at first",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Retry: &toolbus.RetryPolicy{MaxAttempts: 3, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			Codes: []string{"upstream_busy"}},
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			if f.add(ci.IdempotencyKey) < 3 {
				return nil, executor.NewRetryableError("upstream_busy", "the upstream is busy, try again")
			}
			return map[string]string{"status": "done"}, nil
		},
	}
}

// TestConsoleDecisionsInBrowser: a person signed in to the console makes each of the four
// decisions by clicking (edit refused by the schema, edit, reject with a message,
// respond in the tool's place), the model reads the right thing, and the run page shows
// what the person did; a call retried by its tool's policy shows each failed attempt.
func TestConsoleDecisionsInBrowser(t *testing.T) {
	echo := func(req planner.Request) planner.Response {
		return planner.Answer("read: " + req.Messages[len(req.Messages)-1].Content)(req)
	}
	decide := func() *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("b", "deploy", `{"service":"api"}`)), echo}}
	}
	scripts := map[string]*planner.Script{
		"b-edit": decide(), "b-deny": decide(), "b-respond": decide(),
		"b-flaky": {Steps: []func(planner.Request) planner.Response{planner.Calls(call("f", "flaky", `{}`)), echo}},
	}
	flaky := &flakyCounter{runs: map[string]int{}}
	p := startPipeline(t, scripts, deployTool(), flakyTool(flaky))
	srv, users, _ := startConsoleWithUsers(t, p, "erin")
	bctx, dialogs := browser(t)
	do(t, bctx, "sign in", chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`#login-token`, chromedp.ByID),
		chromedp.SendKeys(`#login-token`, users["erin"], chromedp.ByID),
		chromedp.Submit(`#login`, chromedp.ByID),
		chromedp.WaitVisible(`#user`, chromedp.ByID))
	report := func(run string) *audit.Report {
		t.Helper()
		evs, err := runlog.Events(p.ctx, p.bus, run)
		if err != nil {
			t.Fatal(err)
		}
		return audit.Analyze(run, evs)
	}
	// open waits for run to wait for approval and opens its page at the decision form.
	open := func(run string) {
		t.Helper()
		p.submit(run, toolbus.Limits{})
		p.WaitStatus(run, toolbus.RunWaitingForApproval)
		do(t, bctx, "open "+run, chromedp.Navigate(srv.URL+"/runs/"+run),
			chromedp.WaitVisible(`#decide-b button.approve`, chromedp.ByQuery), settled())
	}
	// setArgs replaces the edit box's text (SendKeys would append to the model's).
	setArgs := func(v string) chromedp.Action {
		return chromedp.SetValue(`#decide-b textarea.args-edit`, v, chromedp.ByQuery)
	}

	t.Run("edit", func(t *testing.T) {
		open("b-edit")
		do(t, bctx, "approve an edit the schema refuses",
			setArgs(`{"service":42}`),
			chromedp.Click(`#decide-b button.approve`, chromedp.ByQuery))
		waitPageText(t, bctx, "edit of call b deploy refused")
		if _, err := p.bus.Store().StepDecision(p.ctx, "b-edit", 0, "b"); err == nil {
			t.Fatal("the refused edit was recorded")
		}
		var kind, ran string
		do(t, bctx, "approve a valid edit", chromedp.Navigate(srv.URL+"/runs/b-edit"),
			chromedp.WaitVisible(`#decide-b button.approve`, chromedp.ByQuery), settled(),
			setArgs(`{"service":"web"}`),
			chromedp.Click(`#decide-b button.approve`, chromedp.ByQuery),
			chromedp.WaitVisible(`#live[data-status="completed"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`#call-0-b pre.edited-args`, chromedp.ByQuery),
			text(`#call-0-b .decision-kind`, &kind), text(`#call-0-b pre.edited-args`, &ran))
		if kind != toolbus.DecisionEdited || !strings.Contains(ran, `"web"`) {
			t.Fatalf("the run page shows decision %q and arguments %q", kind, ran)
		}
		r := report("b-edit")
		if c := r.Calls[0]; c.EditedArguments != `{"service":"web"}` || c.DecidedBy != "erin" || !strings.Contains(r.Answer, `{"deployed":"web"}`) {
			t.Fatalf("after the edit: call %+v, answer %q", c, r.Answer)
		}
	})

	t.Run("reject with a message", func(t *testing.T) {
		open("b-deny")
		var why string
		do(t, bctx, "deny with a message",
			chromedp.SendKeys(`#decide-b input.reason`, "change freeze until monday", chromedp.ByQuery),
			chromedp.Click(`#decide-b button.deny`, chromedp.ByQuery),
			chromedp.WaitVisible(`#live[data-status="completed"]`, chromedp.ByQuery),
			text(`#call-0-b .decided-why`, &why))
		if why != "change freeze until monday" {
			t.Fatalf("the run page shows the reason %q", why)
		}
		r := report("b-deny")
		if c := r.Calls[0]; c.DecisionKind != toolbus.DecisionRejected || c.DecidedBy != "erin" ||
			!strings.Contains(r.Answer, "change freeze until monday") {
			t.Fatalf("after the deny: call %+v, answer %q", c, r.Answer)
		}
	})

	t.Run("respond in the tool's place", func(t *testing.T) {
		open("b-respond")
		var answered string
		do(t, bctx, "respond",
			chromedp.SendKeys(`#decide-b input.answer`, "deployed by hand", chromedp.ByQuery),
			chromedp.Click(`#decide-b button.respond`, chromedp.ByQuery),
			chromedp.WaitVisible(`#live[data-status="completed"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`#call-0-b pre.human-response`, chromedp.ByQuery),
			text(`#call-0-b pre.human-response`, &answered))
		if answered != "deployed by hand" {
			t.Fatalf("the run page shows the answer %q", answered)
		}
		r := report("b-respond")
		if c := r.Calls[0]; c.DecisionKind != toolbus.DecisionResponded || !strings.Contains(r.Answer, "deployed by hand") {
			t.Fatalf("after the answer: call %+v, answer %q", c, r.Answer)
		}
	})

	t.Run("retried attempts", func(t *testing.T) {
		p.submit("b-flaky", toolbus.Limits{})
		p.WaitEvent("b-flaky", events.TypeRunEnded(toolbus.RunCompleted))
		var attempts []string
		do(t, bctx, "open the retried run", chromedp.Navigate(srv.URL+"/runs/b-flaky"),
			chromedp.WaitVisible(`#call-0-f ol.retries`, chromedp.ByQuery),
			chromedp.Evaluate(`[...document.querySelectorAll("#call-0-f ol.retries li")].map(e => e.textContent)`, &attempts))
		if len(attempts) != 2 {
			t.Fatalf("the run page shows %d failed attempts (%q), want 2", len(attempts), attempts)
		}
		for i, a := range attempts {
			if !strings.HasPrefix(a, "attempt "+string(rune('1'+i))+": upstream_busy") {
				t.Fatalf("failed attempt %d shown as %q", i+1, a)
			}
		}
		var runs []int
		flaky.mu.Lock()
		for _, n := range flaky.runs {
			runs = append(runs, n)
		}
		flaky.mu.Unlock()
		if len(runs) != 1 || runs[0] != 3 {
			t.Fatalf("the flaky tool ran %v times per call, want 3 for one call", runs)
		}
	})
	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d JavaScript dialog(s) opened", n)
	}
}

// waitPageText waits until the page the browser shows says want. The page is polled
// from Go because a click that submits a form replaces the document under a browser-side
// poll.
func waitPageText(t *testing.T, bctx context.Context, want string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var shown string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(bctx, 5*time.Second)
		err := chromedp.Run(ctx, chromedp.Evaluate(`document.body ? document.body.innerText : ""`, &shown))
		cancel()
		if err == nil && strings.Contains(shown, want) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the page never said %q; it shows %q", want, shown)
}
