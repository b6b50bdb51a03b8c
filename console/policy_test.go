package console

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/planner"
)

// With the injector's decision policy (Options.Deciders, as the binary passes
// TOOLBUS_DECIDERS on a shared server), a signed-in user the policy does not name gets
// 403 with the reason for a decision or a cancel, and nothing is published; a listed
// decider's approval stands.
func TestConsoleDecisionPolicy(t *testing.T) {
	p := startPipeline(t, map[string]*planner.Script{
		"pol-1": {Steps: []func(planner.Request) planner.Response{planner.Calls(call("b", "deploy", `{"service":"api"}`)), planner.Answer("done")}},
	}, deployTool())
	path, users := usersFile(t, "erin", "ops")
	src, err := door.NewSource("", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := startConsole(t, p, Options{Users: src, Deciders: []string{"ops"}})
	p.submit("pol-1", toolbus.Limits{}) // principal tester
	p.WaitStatus("pol-1", toolbus.RunWaitingForApproval)

	for _, path := range []string{"/runs/pol-1/approve", "/runs/pol-1/cancel"} {
		code, body := post(t, srv.URL+path, users["erin"], url.Values{"call": {"b"}})
		if code != http.StatusForbidden || !strings.Contains(body, "erin may not decide on or cancel run pol-1") || !strings.Contains(body, "TOOLBUS_DECIDERS") {
			t.Fatalf("%s by erin: %d %s, want 403 naming the policy", path, code, body)
		}
	}
	if _, err := p.bus.Store().StepDecision(p.ctx, "pol-1", 0, "b"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("erin's refused approval was recorded: %v", err)
	}
	if _, ok, err := runlog.CancelRequest(p.ctx, p.bus, "pol-1"); err != nil || ok {
		t.Fatalf("erin's refused cancel was published: %v %v", ok, err)
	}
	if code, body := post(t, srv.URL+"/runs/pol-1/approve", users["ops"], url.Values{"call": {"b"}}); code != http.StatusSeeOther {
		t.Fatalf("approve by ops: %d %s", code, body)
	}
	p.WaitStatus("pol-1", toolbus.RunCompleted)
}
