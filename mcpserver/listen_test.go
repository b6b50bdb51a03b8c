package mcpserver_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/mcpserver"
)

// TestMCPToolsListChangedOnListen: a 2026-07-28 host (no session) that listens for tool
// list changes (subscriptions/listen, SEP-2575) gets notifications/tools/list_changed
// when an executor starts serving a new tool, and the new tool is then offered.
func TestMCPToolsListChangedOnListen(t *testing.T) {
	p := startPipeline(t)
	d := startDoor(t, p, mcpserver.Config{Refresh: 100 * time.Millisecond})
	changed := make(chan struct{}, 8)
	cs := d.connect(t, d.carol, mcpserver.Protocol2026, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		changed <- struct{}{}
	}})
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "late_tool", Description: "Comes late.", InputSchema: json.RawMessage(`{"type":"object"}`), ReadOnly: true,
		Func: func(context.Context, json.RawMessage) (any, error) { return "late", nil }}); err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithInstance("late-1")))
	p.Roles.Go("late-1", testutil.Must(worker.New(p.bus, exec, worker.Config{
		WorkerConfig: workerconfig.WorkerConfig{Instance: "late-1", Logger: quiet(), Grace: time.Second}})).Run)
	select {
	case <-changed:
	case <-time.After(time.Minute):
		t.Fatal("no notifications/tools/list_changed on the subscriptions/listen stream")
	}
	waitOffered(t, p, cs, "late_tool")
}
