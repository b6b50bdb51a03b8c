package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/mcpserver"
	"github.com/toolbus/toolbus/mcpserver/mcptest"
)

// door is `toolbus mcp --http` on 127.0.0.1:0 over the pipeline, with three callers:
// carol, dave, and another token of carol's name (carol2: a second device of hers).
type testDoor struct {
	url                 string
	carol, dave, carol2 string // their tokens
	p                   *pipeline
}

func startDoor(t *testing.T, p *pipeline, cfg mcpserver.Config) *testDoor {
	t.Helper()
	d := &testDoor{carol: door.NewToken(), dave: door.NewToken(), carol2: door.NewToken(), p: p}
	access, err := door.NewSource(door.Entry("carol", d.carol, []string{"ops"})+"; "+door.Entry("dave", d.dave, nil)+"; "+door.Entry("carol", d.carol2, []string{"ops"}), "")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Source, cfg.Logger = "/mcp-test", quiet()
	srv, err := mcpserver.New(p.ctx, p.bus, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.url = serveDoor(t, srv, access)
	return d
}

// serveDoor serves srv over streamable HTTP to the tokens of access until the test
// ends, and returns its URL.
func serveDoor(t *testing.T, srv *mcp.Server, access *door.Source) string {
	hs := httptest.NewServer(mcpserver.HTTPHandler(srv, mcpserver.HTTPConfig{
		Listen: "127.0.0.1:0", Access: access, SessionTimeout: time.Minute, MaxSessions: 10, Logger: quiet(),
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// bearer adds a bearer token to every request.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// connect connects a go-sdk client with token asking for protocol version, and checks
// that the server negotiated it.
func (d *testDoor) connect(t *testing.T, token, version string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: d.url, HTTPClient: &http.Client{Transport: bearer(token)}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, opts).Connect(d.p.ctx, tr,
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if got := cs.InitializeResult().ProtocolVersion; got != version {
		t.Fatalf("negotiated protocol %s, want %s", got, version)
	}
	return cs
}

// approvals returns the decisions published on run.
func approvals(t *testing.T, p *pipeline, run string) []toolbus.Approval {
	t.Helper()
	evs, err := runlog.Events(p.ctx, p.bus, run)
	if err != nil {
		t.Fatal(err)
	}
	var out []toolbus.Approval
	v := audit.Visitor{Approval: func(_ runlog.StoredEvent, a toolbus.Approval, _ bool) { out = append(out, a) }}
	v.Walk(evs)
	return out
}

// TestMCPApprovalAsksTheUser: on 2026-07-28 (an input_required result the client
// answers with inputResponses) and on 2025-06-18 (elicitation/create to a client that
// declared elicitation), a call that needs approval asks the host's user; approving,
// editing the arguments, answering in the tool's place and denying each become the
// decision the CLI would publish, made by the token's identity, and the host gets the
// call's result.
func TestMCPApprovalAsksTheUser(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{})
	tests := []struct {
		name    string
		answer  map[string]any
		action  string
		isError bool
		text    string // in the result
		kind    string // of the decision
	}{
		{name: "approve", action: "accept", answer: map[string]any{"decision": "approve"}, text: `"restarted":"auth-api"`, kind: toolbus.DecisionApproved},
		{name: "edit", action: "accept", answer: map[string]any{"decision": "edit", "arguments": `{"service":"billing-api"}`}, text: `"restarted":"billing-api"`, kind: toolbus.DecisionEdited},
		{name: "respond", action: "accept", answer: map[string]any{"decision": "respond", "response": "restarted it by hand"}, text: "restarted it by hand", kind: toolbus.DecisionResponded},
		{name: "deny", action: "accept", answer: map[string]any{"decision": "deny", "reason": "not during the sale"}, isError: true, text: "not during the sale", kind: toolbus.DecisionRejected},
		{name: "decline", action: "decline", isError: true, text: "declined by carol", kind: toolbus.DecisionRejected},
	}
	for _, version := range []string{mcpserver.Protocol2026, "2025-06-18"} {
		for _, tt := range tests {
			t.Run(version+"/"+tt.name, func(t *testing.T) {
				var (
					mu    sync.Mutex
					asked []*mcp.ElicitParams
				)
				cs := d.connect(t, d.carol, version, &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					mu.Lock()
					asked = append(asked, req.Params)
					mu.Unlock()
					return &mcp.ElicitResult{Action: tt.action, Content: tt.answer}, nil
				}})
				res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "restart_service", Arguments: map[string]any{"service": "auth-api"}})
				if err != nil {
					t.Fatal(err)
				}
				text := resultText(res)
				if res.IsError != tt.isError || !strings.Contains(text, tt.text) {
					t.Fatalf("result isError %v %q, want isError %v with %q", res.IsError, text, tt.isError, tt.text)
				}
				mu.Lock()
				if len(asked) != 1 || !strings.Contains(asked[0].Message, "restart_service needs approval") {
					t.Fatalf("the user was asked %d times (%+v), want once about restart_service", len(asked), asked)
				}
				mu.Unlock()
				run, _ := res.Meta[mcpserver.MetaRun].(string)
				got := approvals(t, p, run)
				if len(got) != 1 || got[0].Who != "carol" || got[0].Kind(tt.kind == toolbus.DecisionApproved || tt.kind == toolbus.DecisionEdited) != tt.kind {
					t.Fatalf("run %s decisions %+v, want one %s by carol", run, got, tt.kind)
				}
				p.WaitStatus(run, toolbus.RunCompleted)
			})
		}
	}
}

// TestMCPApprovalRefusedEditAsksAgain: an edit the tool's schema refuses publishes
// nothing and the user is asked again, told why; the next answer decides.
func TestMCPApprovalRefusedEditAsksAgain(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{})
	var messages []string
	cs := d.connect(t, d.carol, mcpserver.Protocol2026, &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		messages = append(messages, req.Params.Message)
		if len(messages) == 1 {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "edit", "arguments": `{"service":"NOT VALID"}`}}, nil
		}
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "approve"}}, nil
	}})
	res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "restart_service", Arguments: map[string]any{"service": "auth-api"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || !strings.Contains(resultText(res), `"restarted":"auth-api"`) {
		t.Fatalf("result %q", resultText(res))
	}
	if len(messages) != 2 || !strings.Contains(messages[1], "Refused: edit of call call_0 restart_service refused") {
		t.Fatalf("asked %q, want a second form saying why the edit was refused", messages)
	}
	run, _ := res.Meta[mcpserver.MetaRun].(string)
	if got := approvals(t, p, run); len(got) != 1 || got[0].Arguments != "" {
		t.Fatalf("decisions %+v, want the approval alone", got)
	}
}

// post2026 posts one 2026-07-28 request (headers and per-request _meta, by default
// declaring the Tasks extension), and returns its JSON-RPC result or error.
func post2026(t *testing.T, d *testDoor, token, method, name string, params map[string]any) (result, rpcErr map[string]any, status int) {
	t.Helper()
	if _, ok := params["_meta"]; !ok {
		params["_meta"] = map[string]any{
			mcp.MetaKeyProtocolVersion:    mcpserver.Protocol2026,
			mcp.MetaKeyClientInfo:         map[string]any{"name": "raw", "version": "0"},
			mcp.MetaKeyClientCapabilities: map[string]any{"extensions": map[string]any{mcpserver.ExtTasks: map[string]any{}}},
		}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp := mcptest.Post(t, d.url, token, "", string(body), func(r *http.Request) {
		r.Header.Set("Mcp-Protocol-Version", mcpserver.Protocol2026)
		r.Header.Set("Mcp-Method", method)
		if name != "" {
			r.Header.Set("Mcp-Name", name)
		}
	})
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if i := strings.Index(string(raw), "data: "); i >= 0 {
		raw = []byte(strings.TrimSpace(strings.SplitN(string(raw[i+len("data: "):]), "\n", 2)[0]))
	}
	var msg struct {
		Result map[string]any `json:"result"`
		Error  map[string]any `json:"error"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil && resp.StatusCode == http.StatusOK {
		t.Fatalf("%s: %v in %s", method, err, raw)
	}
	return msg.Result, msg.Error, resp.StatusCode
}

// tasksClient connects a 2026-07-28 go-sdk client that declares the Tasks extension
// and can send tasks/get, tasks/update and tasks/cancel.
func (d *testDoor) tasksClient(t *testing.T, token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	if opts == nil {
		opts = &mcp.ClientOptions{}
	}
	opts.Capabilities = &mcp.ClientCapabilities{Extensions: map[string]any{mcpserver.ExtTasks: map[string]any{}}}
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, opts)
	if err := mcp.AddSendingCustomMethod[*mcpserver.TaskParams, *mcpserver.Task](c, "tasks/get"); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"tasks/update", "tasks/cancel"} {
		if err := mcp.AddSendingCustomMethod[*mcpserver.TaskParams, *mcpserver.TaskAck](c, m); err != nil {
			t.Fatal(err)
		}
	}
	tr := &mcp.StreamableClientTransport{Endpoint: d.url, HTTPClient: &http.Client{Transport: bearer(token)}}
	cs, err := c.Connect(d.p.ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: mcpserver.Protocol2026})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// waitTask polls tasks/get until the task has status want.
func waitTask(t *testing.T, cs *mcp.ClientSession, id, want string) *mcpserver.Task {
	t.Helper()
	var last *mcpserver.Task
	eventstest.Eventually(t, 60*time.Second, func() error {
		task, err := mcp.CallCustomMethod[*mcpserver.TaskParams, *mcpserver.Task](context.Background(), cs, "tasks/get", &mcpserver.TaskParams{TaskID: id})
		if err != nil {
			return err
		}
		last = task
		if task.Status != want {
			return fmt.Errorf("task %s is %s (%s), want %s", id, task.Status, task.StatusMessage, want)
		}
		return nil
	})
	return last
}

// TestMCPTaskAcrossReconnect: a long call from a 2026-07-28 client that declares the
// Tasks extension is answered with a task (resultType "task", the run as task id); a
// new client (after the first went away) fetches its progress and then its result with
// tasks/get, and another token's caller cannot see it.
func TestMCPTaskAcrossReconnect(t *testing.T) {
	p := startPipeline(t, crawlTool(2*time.Second))
	d := startDoor(t, p, mcpserver.Config{TaskAfter: 300 * time.Millisecond, TaskPollInterval: 500 * time.Millisecond})
	waitOffered(t, p, d.tasksClient(t, d.carol, nil), "crawl")
	created, rpcErr, status := post2026(t, d, d.carol, "tools/call", "crawl", map[string]any{"name": "crawl", "arguments": map[string]any{}})
	if status != http.StatusOK || rpcErr != nil {
		t.Fatalf("tools/call: status %d, error %v", status, rpcErr)
	}
	id, _ := created["taskId"].(string)
	if created["resultType"] != "task" || created["status"] != mcpserver.TaskWorking || !strings.HasPrefix(id, "mcp-") ||
		created["pollIntervalMs"] != 500.0 || created["createdAt"] == nil {
		t.Fatalf("tools/call answered %v, want a working task", created)
	}
	cs := d.tasksClient(t, d.carol, nil) // the reconnect: a new client, no session
	if caps := cs.InitializeResult().Capabilities; caps == nil || caps.Extensions[mcpserver.ExtTasks] == nil {
		t.Fatalf("server/discover does not list the Tasks extension: %+v", caps)
	}
	working := waitTask(t, cs, id, mcpserver.TaskWorking)
	if working.ResultType != "complete" {
		t.Fatalf("tasks/get resultType %q", working.ResultType)
	}
	eventstest.Eventually(t, 30*time.Second, func() error {
		task, err := mcp.CallCustomMethod[*mcpserver.TaskParams, *mcpserver.Task](p.ctx, cs, "tasks/get", &mcpserver.TaskParams{TaskID: id})
		if err != nil || !strings.Contains(task.StatusMessage, "page ") {
			return fmt.Errorf("no progress in the task yet: %+v %v", task, err)
		}
		return nil
	})
	done := waitTask(t, cs, id, mcpserver.TaskCompleted)
	if done.Result == nil || done.Result.IsError || !strings.Contains(resultText(done.Result), "pages") {
		t.Fatalf("completed task's result %+v", done.Result)
	}
	other := d.tasksClient(t, d.dave, nil)
	if _, err := mcp.CallCustomMethod[*mcpserver.TaskParams, *mcpserver.Task](p.ctx, other, "tasks/get", &mcpserver.TaskParams{TaskID: id}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("dave's tasks/get of carol's task: %v, want not found", err)
	}
}

// TestMCPTaskCancel: tasks/cancel publishes run.cancel by the caller: the call is
// cancelled, the run ends cancelled and the task reads cancelled.
func TestMCPTaskCancel(t *testing.T) {
	p := startPipeline(t, crawlTool(10*time.Second))
	d := startDoor(t, p, mcpserver.Config{TaskAfter: 300 * time.Millisecond})
	cs := d.tasksClient(t, d.carol, nil)
	waitOffered(t, p, cs, "crawl")
	created, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "crawl", map[string]any{"name": "crawl", "arguments": map[string]any{}})
	id, _ := created["taskId"].(string)
	if rpcErr != nil || id == "" {
		t.Fatalf("tools/call: %v %v", created, rpcErr)
	}
	if _, err := mcp.CallCustomMethod[*mcpserver.TaskParams, *mcpserver.TaskAck](p.ctx, cs, "tasks/cancel", &mcpserver.TaskParams{TaskID: id}); err != nil {
		t.Fatal(err)
	}
	task := waitTask(t, cs, id, mcpserver.TaskCancelled)
	p.WaitStatus(id, toolbus.RunCancelled)
	if !strings.Contains(task.StatusMessage, "tasks/cancel (by carol)") {
		t.Fatalf("cancelled task says %q", task.StatusMessage)
	}
}

// TestMCPTaskWaitsForApproval: a 2026-07-28 call that needs approval from a client that
// takes tasks but cannot ask its user becomes a task at once; tasks/get from a client
// that can ask shows the approval form (input_required), and tasks/update with the
// answer decides the call, by the token's identity.
func TestMCPTaskWaitsForApproval(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{TaskAfter: time.Minute})
	created, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "restart_service", map[string]any{"name": "restart_service", "arguments": map[string]any{"service": "auth-api"}})
	id, _ := created["taskId"].(string)
	if rpcErr != nil || created["resultType"] != "task" || !strings.Contains(fmt.Sprint(created["statusMessage"]), "toolbus approve "+id) {
		t.Fatalf("tools/call: %v %v, want a task telling how to approve", created, rpcErr)
	}
	cs := d.tasksClient(t, d.carol, &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return nil, fmt.Errorf("the form comes in tasks/get here")
	}})
	task := waitTask(t, cs, id, mcpserver.TaskInputRequired)
	if _, ok := task.InputRequests[mcpserver.ApprovalKey].(*mcp.ElicitParams); !ok {
		t.Fatalf("input_required task lacks the approval form: %+v", task.InputRequests)
	}
	if _, err := mcp.CallCustomMethod[*mcpserver.TaskParams, *mcpserver.TaskAck](p.ctx, cs, "tasks/update", &mcpserver.TaskParams{TaskID: id,
		InputResponses: map[string]json.RawMessage{mcpserver.ApprovalKey: json.RawMessage(`{"action":"accept","content":{"decision":"respond","response":"done by hand"}}`)}}); err != nil {
		t.Fatal(err)
	}
	done := waitTask(t, cs, id, mcpserver.TaskCompleted)
	if done.Result == nil || !strings.Contains(resultText(done.Result), "done by hand") {
		t.Fatalf("completed task's result %+v", done.Result)
	}
	if got := approvals(t, p, id); len(got) != 1 || got[0].Who != "carol" || got[0].Response != "done by hand" {
		t.Fatalf("decisions %+v, want carol's answer", got)
	}
}

// TestMCPUnauthorizedChallenge: a 401 carries WWW-Authenticate (RFC 6750), on both
// revisions, naming invalid_token when a token was presented.
func TestMCPUnauthorizedChallenge(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{})
	tests := []struct {
		name, token, version, want string
	}{
		{"no token", "", "", `Bearer realm="toolbus"`},
		{"unknown token", door.NewToken(), "", `Bearer realm="toolbus", error="invalid_token"`},
		{"no token 2026", "", mcpserver.Protocol2026, `Bearer realm="toolbus"`},
		{"unknown token 2026", door.NewToken(), mcpserver.Protocol2026, `Bearer realm="toolbus", error="invalid_token"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := mcptest.Post(t, d.url, tt.token, "", mcptest.Initialize, func(r *http.Request) {
				if tt.version != "" {
					r.Header.Set("Mcp-Protocol-Version", tt.version)
				}
			})
			resp.Body.Close()
			got := resp.Header.Get("WWW-Authenticate")
			if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(got, tt.want) {
				t.Fatalf("status %d, WWW-Authenticate %q, want 401 with %q", resp.StatusCode, got, tt.want)
			}
		})
	}
}

// TestMCPTraceparentJoinsTheRun: a traceparent in the request's _meta (SEP-414) is the
// trace of the call's run: its run.started, model.requested, tool.requested and
// tool.finished carry it, on both revisions; an invalid one is dropped.
func TestMCPTraceparentJoinsTheRun(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, version := range []string{mcpserver.Protocol2026, "2025-06-18"} {
		for _, sent := range []string{tp, "00-not-a-trace"} {
			t.Run(version+"/"+sent, func(t *testing.T) {
				cs := d.connect(t, d.carol, version, nil)
				res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "calculator", Arguments: map[string]any{"expression": "1+1"},
					Meta: mcp.Meta{"traceparent": sent}})
				if err != nil || res.IsError {
					t.Fatalf("calculator: %v %q", err, resultText(res))
				}
				run, _ := res.Meta[mcpserver.MetaRun].(string)
				p.WaitStatus(run, toolbus.RunCompleted)
				want := tp
				if sent != tp {
					want = ""
				}
				evs, err := runlog.Events(p.ctx, p.bus, run)
				if err != nil {
					t.Fatal(err)
				}
				seen := map[string]bool{}
				for _, ev := range evs {
					switch ev.Meta.Type {
					case events.TypeRunStarted, events.TypeModelRequested, events.TypeToolRequested, events.TypeToolFinished:
						seen[ev.Meta.Type] = true
						if ev.Meta.TraceParent != want {
							t.Errorf("%s carries traceparent %q, want %q", ev.Meta.Type, ev.Meta.TraceParent, want)
						}
					}
				}
				if len(seen) != 4 {
					t.Fatalf("run %s has events %v", run, seen)
				}
			})
		}
	}
}

// TestMCPCallerDecidesOnlyOwnCalls: a requestState or a task id names a run, not a
// permission: another token's caller who presents carol's cannot decide, update or
// cancel her call, and nothing is published.
func TestMCPCallerDecidesOnlyOwnCalls(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{TaskAfter: time.Minute})
	created, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "restart_service", map[string]any{"name": "restart_service", "arguments": map[string]any{"service": "auth-api"}})
	run, _ := created["taskId"].(string)
	if rpcErr != nil || run == "" {
		t.Fatalf("carol's call: %v %v", created, rpcErr)
	}
	approve := map[string]any{"action": "accept", "content": map[string]any{"decision": "approve"}}
	tests := []struct {
		name, method, mcpName string
		params                map[string]any
	}{
		{"retry with her requestState", "tools/call", "restart_service", map[string]any{"name": "restart_service", "arguments": map[string]any{"service": "auth-api"},
			"requestState": "toolbus-run:" + run, "inputResponses": map[string]any{mcpserver.ApprovalKey: approve}}},
		{"tasks/update of her task", "tasks/update", run, map[string]any{"taskId": run, "inputResponses": map[string]any{mcpserver.ApprovalKey: approve}}},
		{"tasks/cancel of her task", "tasks/cancel", run, map[string]any{"taskId": run}},
		{"tasks/get of her task", "tasks/get", run, map[string]any{"taskId": run}},
	}
	// Dave, and another token of carol's own name: a run belongs to the token that
	// started it, not to the token's name.
	for who, token := range map[string]string{"dave": d.dave, "carol's other token": d.carol2} {
		for _, tt := range tests {
			t.Run(who+"/"+tt.name, func(t *testing.T) {
				// go-sdk answers a 2026-07-28 request's error with HTTP 400.
				res, rpcErr, status := post2026(t, d, token, tt.method, tt.mcpName, tt.params)
				if rpcErr == nil || rpcErr["code"] != -32602.0 {
					t.Fatalf("%s's %s: status %d, result %v, error %v; want -32602", who, tt.method, status, res, rpcErr)
				}
			})
		}
	}
	if got := approvals(t, p, run); len(got) != 0 {
		t.Fatalf("decisions published on carol's call: %+v", got)
	}
	if _, ok, err := runlog.CancelRequest(p.ctx, p.bus, run); err != nil || ok {
		t.Fatalf("carol's run has a run.cancel (%v, %v)", ok, err)
	}
	// Her own update decides it.
	if _, rpcErr, _ := post2026(t, d, d.carol, "tasks/update", run, map[string]any{"taskId": run, "inputResponses": map[string]any{mcpserver.ApprovalKey: approve}}); rpcErr != nil {
		t.Fatalf("carol's tasks/update: %v", rpcErr)
	}
	p.WaitStatus(run, toolbus.RunCompleted)
	if got := approvals(t, p, run); len(got) != 1 || got[0].Who != "carol" {
		t.Fatalf("decisions %+v, want carol's", got)
	}
}

// TestMCPHostApprovalsOff: with CLIApprovalsOnly (TOOLBUS_MCP_HOST_APPROVALS=false) a
// host that can show forms is not asked: the call is answered with the CLI
// instructions, and a decision sent anyway (a forged retry) is refused with nothing
// published.
func TestMCPHostApprovalsOff(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{CLIApprovalsOnly: true})
	asked := 0
	cs := d.connect(t, d.carol, mcpserver.Protocol2026, &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked++
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "approve"}}, nil
	}})
	res, err := cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "restart_service", Arguments: map[string]any{"service": "auth-api"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(resultText(res), "toolbus approve mcp-") || asked != 0 {
		t.Fatalf("result %q (asked %d times), want the CLI instructions and no form", resultText(res), asked)
	}
	run := runIDRE.FindString(resultText(res))
	_, rpcErr, _ := post2026(t, d, d.carol, "tools/call", "restart_service", map[string]any{"name": "restart_service", "arguments": map[string]any{"service": "auth-api"},
		"requestState": "toolbus-run:" + run, "inputResponses": map[string]any{mcpserver.ApprovalKey: map[string]any{"action": "accept", "content": map[string]any{"decision": "approve"}}}})
	// The door issued no requestState: a forged one is refused before the decision is.
	if rpcErr == nil || !strings.Contains(fmt.Sprint(rpcErr["message"]), "invalid requestState") {
		t.Fatalf("a decision sent anyway: %v, want refused", rpcErr)
	}
	if got := approvals(t, p, run); len(got) != 0 {
		t.Fatalf("decisions published: %+v", got)
	}
}

// TestMCPClosedRequestCancelsRun: a 2026-07-28 client that gives up on a call (it
// closes the request; the revision has no session to send notifications/cancelled on)
// cancels the call's run, as a cancelled request of the older revisions does.
func TestMCPClosedRequestCancelsRun(t *testing.T) {
	p := startPipeline(t, crawlTool(10*time.Second))
	d := startDoor(t, p, mcpserver.Config{})
	cs := d.connect(t, d.carol, mcpserver.Protocol2026, nil)
	waitOffered(t, p, cs, "crawl")
	watch, err := runlog.Watch(p.ctx, p.bus, events.FilterAll, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(p.ctx, 2*time.Second)
	defer cancel()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "crawl", Arguments: map[string]any{}}); err == nil {
		t.Fatal("the call answered within 2s; it should run 25s")
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ev, ok, err := watch.Next(p.ctx, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok && ev.Meta.Type == events.TypeRunEnded(toolbus.RunCancelled) && strings.HasPrefix(ev.Meta.RunID, "mcp-") {
			return
		}
	}
	t.Fatal("no MCP run ended cancelled after its request was closed")
}
