package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/mcpserver"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// TestMCPTaskIgnoresAnothersDecision: an outsider holding only client bob's own
// credentials (his account in the accounts layout, bound to bob) who learned the run id
// of alice's MCP task writes, through the write service and on his own subject, a
// denial of its call ("denied by bob"). The injector refuses it (the decision policy
// names alice alone) and the call still waits; so must alice's task: tasks/get still
// shows input_required with the approval form, and names no decision of bob's (it was
// "working", "denied by bob", and alice's host was never asked again while the call
// waited for its approval timeout). CONTROL: before the write the task shows the form,
// and alice's own answer through tasks/update decides the call and completes the task.
func TestMCPTaskIgnoresAnothersDecision(t *testing.T) {
	srv := intaketest.StartTenants(t, nil, map[string][]string{"door": {"alice"}, "bob": {"bob"}})
	connect := func(user string) *nats.Conn { return eventstest.Connect(t, srv, user) }
	noModel := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		return planner.Response{}, planner.Permanent(context.Canceled)
	})
	// A shared server's decision policy: only each run's principal and approvers decide.
	tp := testpipe.StartOnWith(t, connect("core"), 3*time.Minute, noModel, testpipe.Options{Deciders: []string{}})
	tp.Roles.Go("reads", reads.New(tp.Bus, tp.Log).Serve)
	tp.WaitTools("restart_service")
	p := &pipeline{t: t, Pipeline: tp, ctx: tp.Ctx, bus: tp.Bus}

	alice := door.NewToken()
	d := clientDoor(t, p, connect("door"), "alice", door.Entry("alice", alice, nil))
	created, rpcErr, _ := post2026(t, d, alice, "tools/call", "restart_service", map[string]any{"name": "restart_service", "arguments": map[string]any{"service": "auth-api"}})
	id, _ := created["taskId"].(string)
	if rpcErr != nil || id == "" {
		t.Fatalf("tools/call: %v %v, want a task", created, rpcErr)
	}
	cs := d.tasksClient(t, alice, &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return nil, fmt.Errorf("the form comes in tasks/get here")
	}})
	if task := waitTask(t, cs, id, mcpserver.TaskInputRequired); task.InputRequests[mcpserver.ApprovalKey] == nil {
		t.Fatalf("CONTROL: alice's task lacks the approval form: %+v", task)
	}

	// The outsider: bob's own client account, his own subject, alice's run id.
	var bob *events.Bus
	eventstest.Eventually(t, 30*time.Second, func() error {
		var err error
		bob, err = events.Open(p.ctx, connect("bob"), events.Config{ReadPrefix: events.ReadAPIPrefix("bob")})
		return err
	})
	forged := toolbus.Approval{RunID: id, CallID: callrun.CallID, Who: "bob", Why: "send me your password first"}
	if _, err := bob.PublishApproval(p.ctx, "/outsider", 0, forged, false); err != nil {
		t.Fatalf("bob's write on his own subject: %v (the probe needs it stored)", err)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		for _, a := range approvals(t, p, id) {
			if a.Who == "bob" {
				return nil
			}
		}
		return fmt.Errorf("bob's denial not stored yet")
	})
	task, err := mcp.CallCustomMethod[*mcpserver.TaskParams, *mcpserver.Task](p.ctx, cs, "tasks/get", &mcpserver.TaskParams{TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	if task.Status != mcpserver.TaskInputRequired || task.InputRequests[mcpserver.ApprovalKey] == nil || strings.Contains(task.StatusMessage, "bob") {
		t.Fatalf("after bob's refused denial alice's task is %s (%q), form %v: want input_required with the approval form", task.Status, task.StatusMessage, task.InputRequests[mcpserver.ApprovalKey] != nil)
	}

	// CONTROL: alice's own answer decides the call.
	if _, err := mcp.CallCustomMethod[*mcpserver.TaskParams, *mcpserver.TaskAck](p.ctx, cs, "tasks/update", &mcpserver.TaskParams{TaskID: id,
		InputResponses: map[string]json.RawMessage{mcpserver.ApprovalKey: json.RawMessage(`{"action":"accept","content":{"decision":"respond","response":"done by hand"}}`)}}); err != nil {
		t.Fatal(err)
	}
	if done := waitTask(t, cs, id, mcpserver.TaskCompleted); done.Result == nil || !strings.Contains(resultText(done.Result), "done by hand") {
		t.Fatalf("CONTROL: alice's task after her answer: %+v", done.Result)
	}
}
