package faults_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/internal/door"
)

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// checkMCPDoorProcess runs `toolbus mcp --http` as a process on client alice's
// credentials (her own account and read prefix, no core credential): a token named alice
// lists the tools the core offers and calls lookup_incident as alice; a token named bob,
// an identity alice's account is not bound to, calls nothing; then a task outlives the
// door (checkMCPTaskSurvivesDoor).
func (e *env) checkMCPDoorProcess() {
	t := e.t
	alice, bob := door.NewToken(), door.NewToken()
	tokens := filepath.Join(e.dir, "mcp-tokens")
	if err := os.WriteFile(tokens, []byte(door.Entry("alice", alice, nil)+"\n"+door.Entry("bob", bob, nil)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(freePort(t))
	stateKey := writeStateKey(e)
	p := startProc(t, e.dir, "mcp-alice", e.toolbus, []string{"mcp", "--http", "127.0.0.1:" + port}, mcpDoorEnv(e, tokens, stateKey))
	connect := func(token string) (*mcp.ClientSession, error) {
		return mcp.NewClient(&mcp.Implementation{Name: "faults", Version: "v0"}, nil).Connect(e.ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://127.0.0.1:" + port + "/", HTTPClient: &http.Client{Transport: bearer(token)}, MaxRetries: -1}, nil)
	}
	var cs *mcp.ClientSession
	e.eventually("toolbus mcp --http on alice's credentials answers", time.Minute, func() error {
		var err error
		cs, err = connect(alice)
		return err
	})
	defer cs.Close()
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("the door on alice's credentials lists the tools: %v\n%s", err, p.logTail(20))
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "lookup_incident") {
		t.Errorf("the door on alice's credentials offers %v", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "lookup_incident", Arguments: map[string]any{"incident_id": "INC-001"}})
	if err != nil || res.IsError {
		t.Errorf("alice's call through the door: %v %+v\n%s", err, res, p.logTail(20))
	}
	if bs, err := connect(bob); err == nil {
		res, err := bs.CallTool(ctx, &mcp.CallToolParams{Name: "lookup_incident", Arguments: map[string]any{"incident_id": "INC-001"}})
		if err == nil && !res.IsError {
			t.Errorf("a token of bob, whom alice's account is not bound to, called a tool through her door")
		}
		bs.Close()
	} else if !errors.Is(err, context.Canceled) {
		t.Logf("bob's session: %v", err)
	}
	p.expect()
	e.checkMCPTaskSurvivesDoor(p, port, tokens, stateKey, alice)
}
