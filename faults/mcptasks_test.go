package faults_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/door"
)

// checkMCPTaskSurvivesDoor: a 2026-07-28 host that takes tasks (and shows no forms)
// calls restart_service, which waits for approval, through door (a `toolbus mcp --http`
// process) and gets a task; the door is killed (kill -9) mid-task; a second door
// process, started with the same access list and state key, answers tasks/get for it,
// decides it with tasks/update and sees it completed with the call's result: the task
// lives on the bus, not in a door. The control for ownership: another token of alice's
// own name does not find the task at the second door.
func (e *env) checkMCPTaskSurvivesDoor(doorA *proc, portA, tokens, stateKey, alice string) {
	t := e.t
	portB := strconv.Itoa(freePort(t))
	doorB := startProc(t, e.dir, "mcp-alice-b", e.toolbus, []string{"mcp", "--http", "127.0.0.1:" + portB}, mcpDoorEnv(e, tokens, stateKey))
	defer doorB.stop(10 * time.Second)
	call := map[string]any{"name": "restart_service", "arguments": map[string]any{"service": "auth-api"}}
	var task map[string]any
	e.eventually("door A answers restart_service with a task", time.Minute, func() error {
		res, rpcErr, err := post2026(e.ctx, portA, alice, "tools/call", "restart_service", call)
		if err != nil || rpcErr != nil || res["resultType"] != "task" {
			return fmt.Errorf("%v %v %v", res, rpcErr, err)
		}
		task = res
		return nil
	})
	id, _ := task["taskId"].(string)
	doorA.kill()
	get := map[string]any{"taskId": id}
	e.eventually("door B answers tasks/get for door A's task", time.Minute, func() error {
		res, rpcErr, err := post2026(e.ctx, portB, alice, "tasks/get", id, get)
		if err != nil || rpcErr != nil || res["status"] != "working" || !strings.Contains(fmt.Sprint(res["statusMessage"]), "needs approval") {
			return fmt.Errorf("%v %v %v", res, rpcErr, err)
		}
		return nil
	})
	// Another token of alice's own name: the task is the token's, not the name's.
	other := door.NewToken()
	if err := os.WriteFile(tokens, []byte(door.Entry("alice", alice, nil)+"\n"+door.Entry("alice", other, nil)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.eventually("door B refuses alice's task to her other token", time.Minute, func() error {
		res, rpcErr, err := post2026(e.ctx, portB, other, "tasks/get", id, get)
		if err != nil || rpcErr == nil || rpcErr["code"] != -32602.0 {
			return fmt.Errorf("%v %v %v", res, rpcErr, err)
		}
		return nil
	})
	approve := map[string]any{"taskId": id, "inputResponses": map[string]any{"toolbus_approval": map[string]any{"action": "accept", "content": map[string]any{"decision": "approve"}}}}
	if res, rpcErr, err := post2026(e.ctx, portB, alice, "tasks/update", id, approve); err != nil || rpcErr != nil || res["resultType"] != "complete" {
		t.Fatalf("tasks/update at door B: %v %v %v\n%s", res, rpcErr, err, doorB.logTail(20))
	}
	e.eventually("door A's task completes through door B", time.Minute, func() error {
		res, rpcErr, err := post2026(e.ctx, portB, alice, "tasks/get", id, get)
		if err != nil || rpcErr != nil || res["status"] != "completed" || !strings.Contains(fmt.Sprint(res["result"]), "auth-api") {
			return fmt.Errorf("%v %v %v", res, rpcErr, err)
		}
		return nil
	})
	doorB.expect()
}

// mcpDoorEnv is the environment of a `toolbus mcp --http` process on alice's
// credentials with the access list tokens and the state key file stateKey.
func mcpDoorEnv(e *env, tokens, stateKey string) []string {
	return []string{"TOOLBUS_NATS_URL=" + e.urls(), "TOOLBUS_NATS_USER=alice", "TOOLBUS_NATS_PASSWORD=alice",
		"TOOLBUS_NATS_READ_PREFIX=" + events.ReadAPIPrefix("alice"), "TOOLBUS_MCP_TOKENS_FILE=" + tokens, "TOOLBUS_MCP_STATE_KEY_FILE=" + stateKey}
}

// writeStateKey writes a state key file of the door deployment in dir.
func writeStateKey(e *env) string {
	p := filepath.Join(e.dir, "mcp-state-key")
	if err := os.WriteFile(p, []byte(door.NewToken()+"\n"), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// post2026 posts one 2026-07-28 request to the door on port (stateless: the version and
// the client's capabilities, the Tasks extension and no forms, in _meta) and returns its
// JSON-RPC result or error.
func post2026(ctx context.Context, port, token, method, name string, params map[string]any) (result, rpcErr map[string]any, err error) {
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}},
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:"+port+"/", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	req.Header.Set("Mcp-Name", name)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	if i := bytes.Index(raw, []byte("data: ")); i >= 0 {
		raw = bytes.TrimSpace(bytes.SplitN(raw[i+len("data: "):], []byte("\n"), 2)[0])
	}
	var msg struct {
		Result map[string]any `json:"result"`
		Error  map[string]any `json:"error"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil {
		return nil, nil, fmt.Errorf("status %d: %w in %s", resp.StatusCode, err, raw)
	}
	return msg.Result, msg.Error, nil
}
