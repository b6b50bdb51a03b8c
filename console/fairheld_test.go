package console

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/fair"
	"github.com/toolbus/toolbus/planner"
)

// TestConsoleShowsFairQueued: with fair share on and a cap of one crawl in flight per
// tenant, a run of three crawls has one running and two held by the scheduler; the run
// page and the tools page show those two as queued, with their place in line and the
// scheduler's reason, and the one that reached the executor as running (the control).
func TestConsoleShowsFairQueued(t *testing.T) {
	release := make(chan struct{})
	scripts := map[string]*planner.Script{"fq-1": {Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("c0", "crawl", `{}`), call("c1", "crawl", `{}`), call("c2", "crawl", `{}`)), planner.Answer("done")}}}
	tp := testpipe.StartWith(t, pipelineDeadline, testpipe.ScriptByRun(scripts, nil), testpipe.Options{Bus: events.Config{FairShare: true}}, crawlTool(release))
	p := &pipeline{Pipeline: tp, t: t, ctx: tp.Ctx, srv: tp.Srv, bus: tp.Bus}
	s, err := fair.New(p.ctx, p.bus, fair.Shares{Caps: "crawl=1"}, p.Log)
	if err != nil {
		t.Fatal(err)
	}
	p.Roles.Go("fair", s.Run)
	p.WaitTools("crawl")
	srv := startConsole(t, p, Options{PublicRead: true})
	p.submit("fq-1", toolbus.Limits{})
	want := "queued, 1 of 2 in line; queued: tenant tester has 1 calls of crawl in flight, its cap (2 queued)"
	var body string
	eventstest.Eventually(t, time.Minute, func() error {
		var code int
		code, body = get(t, srv.URL+"/runs/fq-1", "")
		if code != 200 || !strings.Contains(body, want) || !strings.Contains(body, "queued, 2 of 2 in line") {
			return fmt.Errorf("run page (%d) does not show the two held calls as queued yet", code)
		}
		return nil
	})
	calls := regexp.MustCompile(`data-call="[^"]*" data-status="([a-z]+)"`).FindAllStringSubmatch(body, -1)
	status := map[string]int{}
	for _, c := range calls {
		status[c[1]]++
	}
	if status["running"] != 1 || status["queued"] != 2 {
		t.Fatalf("run page's calls %v, want 1 running (the one the executor runs) and 2 queued:\n%s", status, body)
	}
	if code, tools := get(t, srv.URL+"/tools", ""); code != 200 || strings.Count(tools, `data-state="queued, `) != 2 {
		t.Fatalf("tools page (%d) does not show the two held calls as queued:\n%s", code, tools)
	}
	close(release)
	p.WaitStatus("fq-1", toolbus.RunCompleted)
}
