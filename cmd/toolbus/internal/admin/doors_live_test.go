package admin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/mcpserver"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/reads"
)

// TestAdminMCPDoorOnClientCreds: the MCP door on the credentials toolbus admin issues
// for it (add-client door alice, operator mode, the accounts layout), with no core
// credential: a deployment made with no core-wide credentials, the core's roles and
// read service on the admin's and injector's credentials, and the door's own
// connection with client-door.creds lists the tools the core offers and runs a call as
// alice; a run of carol (another client's identity) is not found by the door, while
// carol's own credentials read it (CONTROL).
func TestAdminMCPDoorOnClientCreds(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	l := newLiveAdmin(t, ctx)
	l.adm("", "init")
	l.adm("", "add-client", "door", "alice")
	l.adm("", "add-client", "carol", "carol")
	l.serve()
	noModel := planner.ModelFunc(func(context.Context, planner.Request) (planner.Response, error) {
		return planner.Response{}, planner.Permanent(context.Canceled)
	})
	tp := testpipe.StartOn(t, l.must("admin.creds"), 2*time.Minute, noModel)
	core, err := events.Open(ctx, l.must("injector.creds"), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tp.Roles.Go("reads", reads.New(core, tp.Log).Serve)
	tp.WaitTools("calculator")

	open := func(creds, id string) *events.Bus {
		t.Helper()
		var bus *events.Bus
		eventstest.Eventually(t, 30*time.Second, func() error {
			var err error
			bus, err = events.Open(ctx, l.must(creds), events.Config{ReadPrefix: events.ReadAPIPrefix(id)})
			return err
		})
		return bus
	}
	doorBus := open("client-door.creds", "alice")
	token := door.NewToken()
	access, err := door.NewSource(door.Entry("alice", token, nil), "")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mcpserver.New(ctx, doorBus, mcpserver.Config{Source: "/mcp-test", Principal: "alice"})
	if err != nil {
		t.Fatalf("the door on client-door.creds: %v", err)
	}
	hs := httptest.NewServer(mcpserver.HTTPHandler(srv, mcpserver.HTTPConfig{Listen: "127.0.0.1:0", Access: access, SessionTimeout: time.Minute, MaxSessions: 10}))
	t.Cleanup(hs.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: &http.Client{Transport: bearer(token)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "calculator") {
		t.Fatalf("tools/list on client-door.creds: %v", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "calculator", Arguments: map[string]any{"expression": "6*7"}})
	if err != nil || res.IsError {
		t.Fatalf("calculator(6*7) on client-door.creds: %v %+v", err, res)
	}
	run, _ := res.Meta[mcpserver.MetaRun].(string)
	if rs, err := tp.Bus.RunStarted(ctx, run); err != nil || rs.Principal.ID != "alice" {
		t.Fatalf("the door's run %q: %+v %v", run, rs, err)
	}
	// Carol's run: the door's credentials find nothing of it, carol's find it.
	carol := open("client-carol.creds", "carol")
	tp.SubmitAs("carol-1", "carol", "hello", toolbus.Limits{})
	eventstest.Eventually(t, 30*time.Second, func() error {
		_, err := carol.RunStarted(ctx, "carol-1")
		return err
	})
	if _, err := doorBus.As(ctx, "carol"); err == nil {
		t.Error("the door's credentials read as carol")
	}
	if rs, err := doorBus.RunStarted(ctx, "carol-1"); err == nil {
		t.Errorf("the door's credentials read carol's run: %+v", rs)
	}
}

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}
