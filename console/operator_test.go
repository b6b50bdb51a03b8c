package console

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/planner"
)

// The operator's console (issue 26 item 6), one subtest per point, each in headless
// Chromium against a live pipeline: consistent counts and statuses, live durations,
// running calls and waits shown as such, pretty JSON, the time axis, search and paging,
// filters, the tools page, the raw events. TOOLBUS_CONSOLE_SCREENSHOTS=<dir> also saves
// the screenshots of docs/console.md there (console-runs.png, console-run.png,
// console-tools.png).

// holdTool blocks until its call is cancelled or release is closed: a call that runs as
// long as the test needs.
func holdTool(release <-chan struct{}) executor.Tool {
	return executor.Tool{
		Name: "hold", Description: "runs until released", Version: 3, Timeout: 10 * time.Minute,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-release:
				return map[string]bool{"released": true}, nil
			}
		},
	}
}

// echoTool returns its arguments.
func echoTool() executor.Tool {
	return executor.Tool{
		Name: "echo", Description: "returns its arguments", ReadOnly: true,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(_ context.Context, args json.RawMessage) (any, error) {
			return args, nil
		},
	}
}

// echoArgs are arguments whose keys are not in sorted order and that hold markup: the
// page must show them as written, indented, and as text.
const echoArgs = `{"zone":"eu","a":{"list":[1,2.50]},"s":"<b>x</b>"}`

const echoPretty = "{\n  \"zone\": \"eu\",\n  \"a\": {\n    \"list\": [\n      1,\n      2.50\n    ]\n  },\n  \"s\": \"<b>x</b>\"\n}"

func operatorScripts() map[string]*planner.Script {
	answer := func(s string) *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{planner.Answer(s)}}
	}
	s := map[string]*planner.Script{
		"o-steps": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("n1", "noop", `{}`)),
			planner.Calls(call("n2", "noop", `{}`), call("e", "echo", `{"step":1}`)),
			planner.Answer("three steps"),
		}},
		"o-cancel": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("h", "hold", `{}`)), planner.Answer("unreachable"),
		}},
		"o-live": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("h", "hold", `{}`)), planner.Answer("released"),
		}},
		"o-wait": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("d", "deploy", `{"service":"api"}`)), planner.Answer("deployed"),
		}},
		"o-json": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("j", "echo", echoArgs)), planner.Answer("echoed"),
		}},
	}
	for i := range 7 {
		s[fmt.Sprintf("o-page-%d", i)] = answer("page")
	}
	return s
}

// evalString evaluates a JavaScript expression to a string.
func evalString(expr string, dst *string) chromedp.Action { return chromedp.Evaluate(expr, dst) }

// axisMS reads an axis label (0, 250ms, 1.5s, 2m, 1h) in milliseconds.
func axisMS(t *testing.T, label string) float64 {
	t.Helper()
	if label == "0" {
		return 0
	}
	m := regexp.MustCompile(`^([0-9.]+)(ms|s|m|h)$`).FindStringSubmatch(label)
	if m == nil {
		t.Fatalf("axis label %q", label)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v * map[string]float64{"ms": 1, "s": 1e3, "m": 60e3, "h": 3600e3}[m[2]]
}

func TestConsoleOperator(t *testing.T) {
	release := make(chan struct{})
	p := startPipeline(t, operatorScripts(), deployTool(), hostileTool(), holdTool(release), echoTool())
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	srv, users, _ := startConsoleWithUsers(t, p, "olga")
	bctx, dialogs := browser(t)
	do(t, bctx, "sign in", chromedp.Navigate(srv.URL+"/login"),
		chromedp.WaitVisible(`#login-token`, chromedp.ByID),
		chromedp.SendKeys(`#login-token`, users["olga"], chromedp.ByID),
		chromedp.Submit(`#login`, chromedp.ByID),
		chromedp.WaitVisible(`#user`, chromedp.ByID))

	// The runs: alice's three steps and JSON, bob's cancelled, live and waiting runs,
	// then seven of carol's to page through.
	p.SubmitAs("o-steps", "alice", "three steps please", toolbus.Limits{})
	p.SubmitAs("o-json", "alice", "echo some json", toolbus.Limits{})
	p.SubmitAs("o-cancel", "bob", "to be cancelled", toolbus.Limits{})
	p.SubmitAs("o-live", "bob", "hold on", toolbus.Limits{})
	p.SubmitAs("o-wait", "bob", "deploy api", toolbus.Limits{})
	p.WaitStatus("o-steps", toolbus.RunCompleted)
	p.WaitStatus("o-json", toolbus.RunCompleted)
	p.WaitStatus("o-wait", toolbus.RunWaitingForApproval)
	p.WaitEvent("o-cancel", events.TypeToolRequested)
	if _, err := p.bus.PublishCancel(p.ctx, "/test", toolbus.Cancel{RunID: "o-cancel", Reason: "not needed", Who: "olga"}); err != nil {
		t.Fatal(err)
	}
	p.WaitStatus("o-cancel", toolbus.RunCancelled)
	p.WaitEvent("o-live", events.TypeToolRequested)
	var pageStarts []time.Time
	for i := range 7 {
		run := fmt.Sprintf("o-page-%d", i)
		p.SubmitAs(run, "carol", fmt.Sprintf("paging needle %d", i), toolbus.Limits{})
		p.WaitStatus(run, toolbus.RunCompleted)
		st, _, err := p.bus.Store().RunState(p.ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		pageStarts = append(pageStarts, st.StartedAt)
	}

	t.Run("counts and statuses", func(t *testing.T) {
		var listSteps, pageSteps, cancelStatus, cancelHead string
		do(t, bctx, "the list and the run page",
			chromedp.Navigate(srv.URL+"/?q=o-"),
			chromedp.WaitVisible(`#run-o-steps`, chromedp.ByID),
			text(`#run-o-steps td.steps`, &listSteps),
			text(`#run-o-cancel td.status`, &cancelStatus),
			chromedp.Navigate(srv.URL+"/runs/o-steps"),
			chromedp.WaitVisible(`#run-steps`, chromedp.ByID),
			text(`#run-steps`, &pageSteps),
			chromedp.Navigate(srv.URL+"/runs/o-cancel"),
			chromedp.WaitVisible(`#run-status`, chromedp.ByID),
			text(`.summary h1`, &cancelHead))
		if listSteps != "3" || pageSteps != "3" {
			t.Fatalf("steps: the list says %q, the run page %q; want 3 (three model answers)", listSteps, pageSteps)
		}
		for what, s := range map[string]string{"list": cancelStatus, "run page": cancelHead} {
			if n := strings.Count(s, "cancelled"); n != 1 {
				t.Fatalf("the %s says %q: %d times cancelled, want once", what, s, n)
			}
		}
	})

	t.Run("live durations", func(t *testing.T) {
		var first, later, call string
		do(t, bctx, "a running run's duration",
			chromedp.Navigate(srv.URL+"/runs/o-live"),
			chromedp.WaitVisible(`#run-duration`, chromedp.ByID),
			text(`#run-duration`, &first),
			text(`.row.call[data-call="h"] .dur`, &call))
		if strings.Contains(first, "<1ms") || !strings.HasSuffix(first, "so far") {
			t.Fatalf("duration of a running run %q: want the time since it started, so far", first)
		}
		if !strings.HasPrefix(call, "running ") || strings.Contains(call, "<1ms") {
			t.Fatalf("a running call's duration %q: want running and its time so far", call)
		}
		// The page counts on its own, with no event on the bus.
		do(t, bctx, "the duration grows",
			chromedp.Poll(fmt.Sprintf(`document.querySelector("#run-duration").textContent !== %q`, first), nil, chromedp.WithPollingTimeout(20*time.Second)),
			text(`#run-duration`, &later))
		if later == first {
			t.Fatalf("duration still %q", later)
		}
		var listDur string
		do(t, bctx, "the list's duration", chromedp.Navigate(srv.URL+"/?q=o-live"),
			chromedp.WaitVisible(`#run-o-live`, chromedp.ByID), text(`#run-o-live td.duration`, &listDur))
		if listDur == "" || strings.Contains(listDur, "<1ms") {
			t.Fatalf("the list's duration of a running run: %q", listDur)
		}
	})

	t.Run("tools page", func(t *testing.T) {
		var inflight, instances, owner, heartbeat, liveState, waitState string
		// The cancelled run's call leaves the queue when its executor acknowledges it.
		eventstest.Eventually(t, 30*time.Second, func() error {
			do(t, bctx, "the tools page", chromedp.Navigate(srv.URL+"/tools"),
				chromedp.WaitVisible(`#tool-hold`, chromedp.ByID),
				text(`#tool-hold td.inflight`, &inflight))
			if inflight != "1" {
				return fmt.Errorf("hold's queue: %q in flight, want 1 (o-live's call, delivered and not acknowledged)", inflight)
			}
			return nil
		})
		do(t, bctx, "the tools page",
			text(`#tool-hold td.inflight`, &inflight),
			text(`#tool-hold td.instances`, &instances),
			text(`#tool-hold td.owner`, &owner),
			text(`#instance-exec-1 td.heartbeat`, &heartbeat),
			text(`tr.open-call[data-run="o-live"][data-call="h"]`, &liveState),
			text(`tr.open-call[data-run="o-wait"][data-call="d"]`, &waitState))
		if inflight != "1" {
			t.Fatalf("hold's queue: %q in flight, want 1 (o-live's call, delivered and not acknowledged)", inflight)
		}
		if !strings.Contains(instances, "exec-1") || !strings.Contains(owner, "v3") {
			t.Fatalf("hold served by %q, contract %q: want exec-1 and version 3", instances, owner)
		}
		if !strings.HasSuffix(heartbeat, "ago") || len(heartbeat) < 5 {
			t.Fatalf("exec-1's heartbeat %q", heartbeat)
		}
		if !strings.Contains(liveState, "running") || !strings.Contains(waitState, "waiting for approval") {
			t.Fatalf("open calls: o-live %q, o-wait %q", liveState, waitState)
		}
		screenshot(t, bctx, "console-tools.png")
	})

	t.Run("running and waiting", func(t *testing.T) {
		var live, wait, waitDur string
		var execBars, waitBars int
		do(t, bctx, "a running call",
			chromedp.Navigate(srv.URL+"/runs/o-live"),
			chromedp.WaitVisible(`.row.call[data-call="h"]`, chromedp.ByQuery),
			chromedp.Evaluate(`document.querySelector('.row.call[data-call="h"]').dataset.status`, &live),
			chromedp.Evaluate(`document.querySelectorAll('.row.call[data-call="h"] rect.seg-exec.running').length`, &execBars))
		if live != "running" || execBars != 1 {
			t.Fatalf("o-live's call: status %q, %d running bar(s); want running and one", live, execBars)
		}
		do(t, bctx, "a call that waits for approval",
			chromedp.Navigate(srv.URL+"/runs/o-wait"),
			chromedp.WaitVisible(`.row.call[data-call="d"]`, chromedp.ByQuery),
			chromedp.Evaluate(`document.querySelector('.row.call[data-call="d"]').dataset.status`, &wait),
			chromedp.Evaluate(`document.querySelectorAll('.row.call[data-call="d"] rect.seg-wait.waiting').length - document.querySelectorAll('.row.call[data-call="d"] rect.seg-exec').length`, &waitBars),
			text(`.row.call[data-call="d"] .dur`, &waitDur))
		if wait != "waiting" || waitBars != 1 || !strings.HasPrefix(waitDur, "waiting for approval ") || strings.Contains(waitDur, "<1ms") {
			t.Fatalf("o-wait's call: status %q, wait bars minus run bars %d, %q; want a wait bar only, waiting for approval and for how long", wait, waitBars, waitDur)
		}
		// Approved, the call shows its wait and then its run.
		step, _, err := p.bus.Store().RunState(p.ctx, "o-wait")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.bus.PublishApproval(p.ctx, "/test", step.Step, toolbus.Approval{RunID: "o-wait", CallID: "d", Who: "olga"}, true); err != nil {
			t.Fatal(err)
		}
		p.WaitStatus("o-wait", toolbus.RunCompleted)
		var segs int
		do(t, bctx, "the call after the approval",
			chromedp.Navigate(srv.URL+"/runs/o-wait"),
			chromedp.WaitVisible(`.row.call[data-call="d"][data-status="succeeded"]`, chromedp.ByQuery),
			chromedp.Evaluate(`document.querySelectorAll('.row.call[data-call="d"] rect.seg-wait:not(.waiting)').length + document.querySelectorAll('.row.call[data-call="d"] rect.seg-exec.st-succeeded').length`, &segs),
			text(`.row.call[data-call="d"] .dur`, &waitDur))
		if segs != 2 || !strings.HasPrefix(waitDur, "waited ") {
			t.Fatalf("the approved call: %d of its 2 segments (wait, run), %q; want both and how long it waited", segs, waitDur)
		}
		screenshot(t, bctx, "console-run.png")
	})

	t.Run("pretty JSON", func(t *testing.T) {
		var args, content string
		do(t, bctx, "the call's arguments and result",
			chromedp.Navigate(srv.URL+"/runs/o-json"),
			chromedp.WaitVisible(`#call-0-j`, chromedp.ByID),
			text(`#call-0-j pre.args`, &args),
			text(`#call-0-j pre.content`, &content))
		if args != echoPretty {
			t.Fatalf("arguments shown as\n%s\nwant\n%s", args, echoPretty)
		}
		// The executor stores the result in canonical JSON (sorted keys): shown as stored,
		// indented.
		const contentPretty = "{\n  \"a\": {\n    \"list\": [\n      1,\n      2.50\n    ]\n  },\n  \"s\": \"<b>x</b>\",\n  \"zone\": \"eu\"\n}"
		if content != contentPretty {
			t.Fatalf("result shown as\n%s\nwant\n%s", content, contentPretty)
		}
	})

	t.Run("time axis", func(t *testing.T) {
		var labels []string
		var duration string
		do(t, bctx, "the axis",
			chromedp.Navigate(srv.URL+"/runs/o-steps"),
			chromedp.WaitVisible(`#axis`, chromedp.ByID),
			chromedp.Evaluate(`[...document.querySelectorAll("#axis text")].map(e => e.textContent)`, &labels),
			text(`#run-duration`, &duration))
		if len(labels) < 2 || labels[0] != "0" {
			t.Fatalf("axis labels %q: want 0 and at least one more", labels)
		}
		prev := -1.0
		for _, l := range labels {
			v := axisMS(t, l)
			if v <= prev {
				t.Fatalf("axis labels %q do not increase", labels)
			}
			prev = v
		}
		if d := axisMS(t, strings.TrimSpace(duration)); prev > d {
			t.Fatalf("axis ends at %q, after the run's duration %q", labels[len(labels)-1], duration)
		}
	})

	t.Run("search and paging", func(t *testing.T) {
		seen := map[string]bool{}
		readPage := func(what string, actions ...chromedp.Action) ([]string, string) {
			var ids []string
			var count string
			do(t, bctx, what, append(actions,
				chromedp.WaitVisible(`#count`, chromedp.ByID),
				chromedp.Evaluate(`[...document.querySelectorAll("tr[data-run]")].map(e => e.dataset.run)`, &ids),
				text(`#count`, &count))...)
			for _, id := range ids {
				if seen[id] {
					t.Fatalf("%s: %s shown on two pages", what, id)
				}
				seen[id] = true
			}
			return ids, count
		}
		ids, count := readPage("search", chromedp.Navigate(srv.URL+"/?n=3"),
			chromedp.WaitVisible(`#q`, chromedp.ByID),
			chromedp.SendKeys(`#q`, "PAGING needle", chromedp.ByID),
			// The page before the search has a next link too: without it, the one waited
			// for below is the results'.
			chromedp.Evaluate(`document.querySelector("#next")?.remove()`, nil),
			chromedp.Click(`#apply`, chromedp.ByID),
			chromedp.WaitVisible(`#next`, chromedp.ByID))
		if len(ids) != 3 || ids[0] != "o-page-6" || count != "runs 1–3 of 7 matching" {
			t.Fatalf("first page %q (%q): want o-page-6 first, 3 of 7", ids, count)
		}
		ids, _ = readPage("next page", chromedp.Evaluate(`document.querySelector("#next").click()`, nil), chromedp.WaitVisible(`#prev`, chromedp.ByID))
		if len(ids) != 3 {
			t.Fatalf("second page %q", ids)
		}
		var hasNext bool
		ids, count = readPage("last page", chromedp.Evaluate(`document.querySelector("#next").click()`, nil),
			chromedp.WaitVisible(`tr[data-run="o-page-0"]`, chromedp.ByQuery))
		do(t, bctx, "no next page", chromedp.Evaluate(`!!document.querySelector("#next")`, &hasNext))
		if len(ids) != 1 || ids[0] != "o-page-0" || hasNext || count != "runs 7–7 of 7 matching" {
			t.Fatalf("last page %q (%q), next link %v", ids, count, hasNext)
		}
		if len(seen) != 7 {
			t.Fatalf("paging showed %d runs, want the 7", len(seen))
		}
	})

	t.Run("filters", func(t *testing.T) {
		rows := func(what, query string) []string {
			var ids []string
			do(t, bctx, what, chromedp.Navigate(srv.URL+"/?"+query),
				chromedp.WaitVisible(`#count`, chromedp.ByID),
				chromedp.Evaluate(`[...document.querySelectorAll("tr[data-run]")].map(e => e.dataset.run)`, &ids))
			return ids
		}
		want := func(what string, got []string, ids ...string) {
			t.Helper()
			if strings.Join(got, " ") != strings.Join(ids, " ") {
				t.Fatalf("%s: %q, want %q", what, got, ids)
			}
		}
		// From the form: principal and status.
		var ids []string
		do(t, bctx, "filter by principal from the form", chromedp.Navigate(srv.URL+"/"),
			chromedp.WaitVisible(`#principal`, chromedp.ByID),
			chromedp.SendKeys(`#principal`, "bob", chromedp.ByID),
			chromedp.SetValue(`#status`, "cancelled", chromedp.ByID),
			chromedp.Click(`#apply`, chromedp.ByID),
			chromedp.WaitVisible(`#clear`, chromedp.ByID),
			chromedp.Evaluate(`[...document.querySelectorAll("tr[data-run]")].map(e => e.dataset.run)`, &ids))
		want("bob's cancelled runs", ids, "o-cancel")
		want("alice's runs", rows("principal", "principal=alice"), "o-json", "o-steps")
		want("runs that called echo", rows("tool", "tool=echo"), "o-json", "o-steps")
		want("runs that called deploy", rows("tool", "tool=deploy"), "o-wait")
		since := pageStarts[4].Format(time.RFC3339Nano)
		want("carol's runs since the fifth", rows("time", "principal=carol&since="+since), "o-page-6", "o-page-5", "o-page-4")
		until := pageStarts[1].Format(time.RFC3339Nano)
		want("carol's runs until the second", rows("time", "principal=carol&until="+until), "o-page-1", "o-page-0")
		screenshot(t, bctx, "") // no picture of a filtered list
		do(t, bctx, "the whole list", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`#run-o-live`, chromedp.ByID))
		screenshot(t, bctx, "console-runs.png")
	})

	t.Run("raw events", func(t *testing.T) {
		evs, err := runlog.Events(p.ctx, p.bus, "o-steps")
		if err != nil {
			t.Fatal(err)
		}
		var shown []string
		var asJSON string
		do(t, bctx, "the raw events",
			chromedp.Navigate(srv.URL+"/runs/o-steps"),
			chromedp.WaitVisible(`#raw-events`, chromedp.ByID),
			chromedp.Evaluate(`document.querySelector("#raw-events").click()`, nil),
			chromedp.WaitVisible(`#events-json`, chromedp.ByID),
			chromedp.Evaluate(`[...document.querySelectorAll("details.event pre.cloudevent")].map(e => e.textContent)`, &shown),
			chromedp.Evaluate(`fetch("/runs/o-steps/events.json").then(r => r.text())`, &asJSON, func(p *runtime.EvaluateParams) *runtime.EvaluateParams {
				return p.WithAwaitPromise(true)
			}))
		if len(shown) != len(evs) {
			t.Fatalf("%d events shown, the stream has %d", len(shown), len(evs))
		}
		for i, s := range shown {
			var ce map[string]any
			if err := json.Unmarshal([]byte(s), &ce); err != nil {
				t.Fatalf("event %d is not JSON: %v\n%s", i, err, s)
			}
			if ce["specversion"] != "1.0" || ce["type"] != evs[i].Meta.Type || ce["id"] != evs[i].Meta.ID || ce["source"] != evs[i].Meta.Source || ce["data"] == nil {
				t.Fatalf("event %d shown as %v, stored as %+v", i, ce, evs[i].Meta)
			}
		}
		var listed []rawEvent
		if err := json.Unmarshal([]byte(asJSON), &listed); err != nil || len(listed) != len(evs) {
			t.Fatalf("events.json: %d events (%v), want %d", len(listed), err, len(evs))
		}
		for i, e := range listed {
			if e.Seq != evs[i].Seq || e.Subject != evs[i].Subject || len(e.CloudEvent) == 0 {
				t.Fatalf("events.json event %d: %+v, stored seq %d on %s", i, e, evs[i].Seq, evs[i].Subject)
			}
		}
	})

	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d JavaScript dialog(s) opened", n)
	}
}

// screenshot saves the page in $TOOLBUS_CONSOLE_SCREENSHOTS/name, when set (name ""
// saves nothing).
func screenshot(t *testing.T, bctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("TOOLBUS_CONSOLE_SCREENSHOTS")
	if dir == "" || name == "" {
		return
	}
	var png []byte
	do(t, bctx, "screenshot "+name, chromedp.FullScreenshot(&png, 100))
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
