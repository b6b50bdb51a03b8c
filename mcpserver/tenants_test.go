package mcpserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/mcpserver"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// clientDoor is `toolbus mcp --http` on a client account's own connection (user, the
// accounts layout), reading as id (TOOLBUS_NATS_READ_PREFIX) and serving the tokens of
// access.
func clientDoor(t *testing.T, p *pipeline, nc *nats.Conn, id, access string) *testDoor {
	t.Helper()
	var bus *events.Bus
	eventstest.Eventually(t, 30*time.Second, func() error { // the read service subscribes as the pipeline starts
		var err error
		bus, err = events.Open(p.ctx, nc, events.Config{ReadPrefix: events.ReadAPIPrefix(id)})
		return err
	})
	src, err := door.NewSource(access, "")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mcpserver.New(p.ctx, bus, mcpserver.Config{Source: "/mcp-test", Principal: id, Logger: quiet(), TaskAfter: time.Minute})
	if err != nil {
		t.Fatalf("the door on %s's client account: %v", id, err)
	}
	d := &testDoor{p: p, url: serveDoor(t, srv, src)}
	return d
}

// TestMCPDoorOnAClientAccount: `toolbus mcp --http` runs on a client account's
// credentials bound to the identities it serves (the accounts layout: the door's own
// connection, no core credential), reading through the core's read service: each
// token's caller lists the tools the core offers, calls one and reads its task; a
// caller of an identity the door's account is not bound to reads nothing of that
// identity's run (the read service of another identity answers nothing) and calls
// nothing. CONTROL: a door on the owner's client account reads the same run with the
// same token; and within the door, bob reads his own task, which alice cannot.
func TestMCPDoorOnAClientAccount(t *testing.T) {
	srv := intaketest.StartTenants(t, nil, map[string][]string{"door": {"alice", "bob"}, "carol": {"carol"}})
	connect := func(user string) *nats.Conn { return eventstest.Connect(t, srv, user) }
	noModel := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		return planner.Response{}, planner.Permanent(context.Canceled)
	})
	tp := testpipe.StartOn(t, connect("core"), 3*time.Minute, noModel)
	tp.Roles.Go("reads", reads.New(tp.Bus, tp.Log).Serve)
	tp.WaitTools("calculator")
	p := &pipeline{t: t, Pipeline: tp, ctx: tp.Ctx, bus: tp.Bus}

	alice, bob, carol := door.NewToken(), door.NewToken(), door.NewToken()
	// The door of the alice and bob account also lets a token named carol in (a
	// mistake of its access list): its account is not bound to carol.
	shared := clientDoor(t, p, connect("door"), "alice",
		door.Entry("alice", alice, nil)+"; "+door.Entry("bob", bob, nil)+"; "+door.Entry("carol", carol, nil))
	own := clientDoor(t, p, connect("carol"), "carol", door.Entry("carol", carol, nil))

	call := func(d *testDoor, token, who string) string {
		t.Helper()
		cs := d.connect(t, token, mcpserver.Protocol2026, nil)
		list, err := cs.ListTools(p.ctx, nil)
		if err != nil {
			t.Fatalf("%s lists the tools: %v", who, err)
		}
		found := false
		for _, tool := range list.Tools {
			found = found || tool.Name == "calculator"
		}
		if !found {
			t.Fatalf("%s's tools/list lacks calculator: %d tools", who, len(list.Tools))
		}
		res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "calculator", Arguments: map[string]any{"expression": "6*7"}})
		if err != nil || res.IsError || !strings.Contains(resultText(res), "42") {
			t.Fatalf("%s's calculator(6*7): %v %q", who, err, resultText(res))
		}
		run, _ := res.Meta[mcpserver.MetaRun].(string)
		rs, err := p.bus.RunStarted(p.ctx, run)
		if err != nil || rs.Principal.ID != who {
			t.Fatalf("%s's run %q: %+v %v", who, run, rs, err)
		}
		return run
	}
	taskGet := func(d *testDoor, token, run string) map[string]any {
		t.Helper()
		res, rpcErr, status := post2026(t, d, token, "tasks/get", run, map[string]any{"taskId": run})
		if rpcErr != nil {
			return nil
		}
		if status != 200 {
			t.Fatalf("tasks/get %s: status %d", run, status)
		}
		return res
	}
	aliceRun, bobRun, carolRun := call(shared, alice, "alice"), call(shared, bob, "bob"), call(own, carol, "carol")
	for _, tc := range []struct {
		name      string
		d         *testDoor
		token     string
		run       string
		wantFound bool
	}{
		{"alice reads her task", shared, alice, aliceRun, true},
		{"bob reads his task (through bob's read service)", shared, bob, bobRun, true},
		{"alice reads bob's task", shared, alice, bobRun, false},
		{"carol's token on a door not bound to carol reads her task", shared, carol, carolRun, false},
		{"CONTROL: carol's token on her own door reads her task", own, carol, carolRun, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := taskGet(tc.d, tc.token, tc.run)
			if found := got != nil && got["status"] == mcpserver.TaskCompleted; found != tc.wantFound {
				t.Fatalf("tasks/get %s: %v, want found %v", tc.run, got, tc.wantFound)
			}
		})
	}
	// A door not bound to carol starts nothing in her name.
	cs := shared.connect(t, carol, mcpserver.Protocol2026, nil)
	res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "calculator", Arguments: map[string]any{"expression": "1+1"}})
	if err == nil && !res.IsError {
		t.Fatalf("a door not bound to carol called a tool as carol: %q", resultText(res))
	}
}
