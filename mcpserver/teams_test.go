package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/door"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/mcpserver"
)

// TestMCPTokensSeeTheirTeamsTools: a token that names teams lists and calls only the
// tools those teams own (and the tools no team owns); another team's tool is unknown to
// it and does not run. A token without teams sees every tool. The run a call starts
// carries its caller: the token's name as principal, its teams as roles.
func TestMCPTokensSeeTheirTeamsTools(t *testing.T) {
	p := startPipeline(t)
	var ran atomic.Int32
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "payroll", Description: "HR's payroll lookup", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) { ran.Add(1); return "salaries", nil }}); err != nil {
		t.Fatal(err)
	}
	w := testutil.Must(worker.New(p.bus, testutil.Must(executor.New(reg)), worker.Config{
		WorkerConfig: workerconfig.WorkerConfig{Instance: "hr-1", Grace: time.Second, Logger: quiet()}, Team: "hr"}))
	wctx, stop := context.WithCancel(p.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })

	hank, erin, dave := door.NewToken(), door.NewToken(), door.NewToken()
	access, err := door.NewSource(strings.Join([]string{door.Entry("hank", hank, []string{"hr"}),
		door.Entry("erin", erin, []string{"search"}), door.Entry("dave", dave, nil)}, ";"), "")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mcpserver.New(p.ctx, p.bus, mcpserver.Config{Source: "/mcp-test", Logger: quiet(), Refresh: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(mcpserver.HTTPHandler(srv, mcpserver.HTTPConfig{Listen: "127.0.0.1:0", Access: access, Logger: quiet()}))
	t.Cleanup(hs.Close)
	client := func(token string) *mcp.ClientSession {
		tr := &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: &http.Client{Transport: bearer(token)}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "v0"}, nil).Connect(p.ctx, tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	names := func(cs *mcp.ClientSession) []string {
		res, err := cs.ListTools(p.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tool := range res.Tools {
			out = append(out, tool.Name)
		}
		return out
	}
	hankCS, erinCS, daveCS := client(hank), client(erin), client(dave)
	eventstest.Eventually(t, 30*time.Second, func() error {
		if !slices.Contains(names(daveCS), "payroll") {
			return errFmt("payroll not offered yet")
		}
		return nil
	})
	for who, c := range map[string]struct {
		cs   *mcp.ClientSession
		sees bool
	}{"hank (hr)": {hankCS, true}, "erin (search)": {erinCS, false}, "dave (no teams)": {daveCS, true}} {
		got := names(c.cs)
		if slices.Contains(got, "payroll") != c.sees || !slices.Contains(got, "calculator") {
			t.Errorf("%s lists %v: payroll offered %v, want %v (and the unowned calculator)", who, got, !c.sees, c.sees)
		}
	}
	res, err := erinCS.CallTool(p.ctx, &mcp.CallToolParams{Name: "payroll", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.Contains(resultText(res), "unknown tool") {
		t.Fatalf("erin calls hr's payroll: %v %+v", err, res)
	}
	if ran.Load() != 0 {
		t.Fatal("another team's token ran hr's tool")
	}
	res, err = hankCS.CallTool(p.ctx, &mcp.CallToolParams{Name: "payroll", Arguments: map[string]any{}})
	if err != nil || res.IsError || ran.Load() != 1 {
		t.Fatalf("hank calls his team's payroll: %v %+v (ran %d)", err, res, ran.Load())
	}
	// The run a door starts carries its caller: the token's name and teams.
	states, err := p.bus.Store().Runs(p.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var principals []string
	for _, st := range states {
		rs, err := p.bus.RunStarted(p.ctx, st.RunID)
		if err != nil {
			t.Fatal(err)
		}
		principals = append(principals, rs.Principal.ID+"/"+strings.Join(rs.Principal.Roles, ","))
	}
	if !slices.Contains(principals, "hank/hr") {
		t.Fatalf("the runs' principals are %v: no run of hank with his team hr", principals)
	}
}

type errFmt string

func (e errFmt) Error() string { return string(e) }
