package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/planner"
)

// TestConsoleDecisions: the console offers the four decisions: an edit of the arguments
// (refused with the reason when the tool's schema refuses it, nothing published) and an
// answer in the tool's place, each recorded with the signed-in user and read by the model.
func TestConsoleDecisions(t *testing.T) {
	echo := func(req planner.Request) planner.Response {
		return planner.Answer("read: " + req.Messages[len(req.Messages)-1].Content)(req)
	}
	scripts := map[string]*planner.Script{
		"c-edit":    {Steps: []func(planner.Request) planner.Response{planner.Calls(call("b", "deploy", `{"service":"api"}`)), echo}},
		"c-respond": {Steps: []func(planner.Request) planner.Response{planner.Calls(call("b", "deploy", `{"service":"api"}`)), echo}},
	}
	p := startPipeline(t, scripts, deployTool())
	srv, users, _ := startConsoleWithUsers(t, p, "erin")
	erin := users["erin"]
	report := func(run string) *audit.Report {
		evs, err := runlog.Events(p.ctx, p.bus, run)
		if err != nil {
			t.Fatal(err)
		}
		return audit.Analyze(run, evs)
	}

	p.submit("c-edit", toolbus.Limits{})
	p.WaitStatus("c-edit", toolbus.RunWaitingForApproval)
	_, body := get(t, srv.URL+"/runs/c-edit", erin)
	wantContains(t, "run page", body, `name="args"`, `formaction="/runs/c-edit/respond"`)
	code, body := post(t, srv.URL+"/runs/c-edit/approve", erin, url.Values{"call": {"b"}, "args": {`{"service":42}`}})
	if code != http.StatusConflict || !strings.Contains(body, "edit of call b deploy refused") {
		t.Fatalf("invalid edit: %d %s, want 409 with the reason", code, body)
	}
	if _, err := p.bus.Store().StepDecision(p.ctx, "c-edit", 0, "b"); err == nil {
		t.Fatal("an invalid edit was recorded")
	}
	code, body = post(t, srv.URL+"/runs/c-edit/approve", erin, url.Values{"call": {"b"}, "args": {`{"service":"web"}`}})
	if code != http.StatusSeeOther {
		t.Fatalf("edit: %d %s", code, body)
	}
	p.WaitEvent("c-edit", events.TypeRunEnded(toolbus.RunCompleted))
	r := report("c-edit")
	if c := r.Calls[0]; c.DecisionKind != toolbus.DecisionEdited || c.EditedArguments != `{"service":"web"}` || c.DecidedBy != "erin" ||
		!strings.Contains(r.Answer, `{"deployed":"web"}`) {
		t.Fatalf("after the console's edit: call %+v, answer %q", c, r.Answer)
	}

	p.submit("c-respond", toolbus.Limits{})
	p.WaitStatus("c-respond", toolbus.RunWaitingForApproval)
	if code, _ := post(t, srv.URL+"/runs/c-respond/respond", erin, url.Values{"call": {"b"}}); code != http.StatusBadRequest {
		t.Fatalf("respond without an answer: %d, want 400", code)
	}
	code, body = post(t, srv.URL+"/runs/c-respond/respond", erin, url.Values{"call": {"b"}, "answer": {"done by hand"}})
	if code != http.StatusSeeOther {
		t.Fatalf("respond: %d %s", code, body)
	}
	p.WaitEvent("c-respond", events.TypeRunEnded(toolbus.RunCompleted))
	r = report("c-respond")
	if c := r.Calls[0]; c.DecisionKind != toolbus.DecisionResponded || c.Response != "done by hand" ||
		!strings.Contains(r.Answer, "answered by a person (erin) in place of the tool") {
		t.Fatalf("after the console's answer: call %+v, answer %q", c, r.Answer)
	}
}
