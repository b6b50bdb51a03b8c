package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// TestForeignOutputRefNotRead: output keys are predictable, and a result's attachment
// reference is data its team wrote. In the accounts layout team beta keeps an output
// (a stored attachment of one of its calls); team alpha's executor answers its own call
// with a result whose attachment 0 names beta's output and attachment 1 its own stored
// attachment (the control). The model request of alpha's run carries alpha's own bytes
// and never beta's: attachment 0 reaches the model without bytes, and the result's
// content says an attachment was withheld. Nor does a client's run whose own messages
// name beta's output.
func TestForeignOutputRefNotRead(t *testing.T) {
	srv, _ := startTenants(t, map[string][]string{"alpha": {"snap"}, "beta": {"search"}}, intake.Limits{})
	var (
		mu              sync.Mutex
		seen, clientRun []toolbus.Message
	)
	model := planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		if req.RunID == "ref-2" {
			mu.Lock()
			defer mu.Unlock()
			clientRun = append(clientRun, req.Messages...)
			return planner.Response{Message: toolbus.Message{Content: "seen"}}, nil
		}
		if req.Step == 0 {
			return planner.Response{Message: toolbus.Message{ToolCalls: []toolbus.ToolCall{{CallID: "c1", Tool: "snap", Arguments: "{}"}}}}, nil
		}
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, req.Messages...)
		return planner.Response{Message: toolbus.Message{Content: "seen"}}, nil
	})
	p := testpipe.StartOn(t, eventstest.Connect(t, srv, "core"), 2*time.Minute, model)
	if _, err := provision.Consumer(p.Ctx, p.Bus, provision.ToolConsumerConfig("snap", 0, 0)); err != nil {
		t.Fatal(err)
	}
	teamBus := func(team string) *events.Bus {
		b, err := events.Open(p.Ctx, eventstest.Connect(t, srv, team), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	alphaBus, betaBus := teamBus("alpha"), teamBus("beta")
	betaSecret := bytes.Repeat([]byte("BETA-PAYROLL "), 1000)
	betaRef, err := betaBus.Store().PutAttachment(p.Ctx, "search", "beta-run", 0, "c1", 0, betaSecret)
	if err != nil {
		t.Fatal(err)
	}
	own := bytes.Repeat([]byte{7}, 9000)
	const run = "ref-1"
	ownRef, err := alphaBus.Store().PutAttachment(p.Ctx, "snap", run, 0, "c1", 1, own)
	if err != nil {
		t.Fatal(err)
	}

	// Alpha's tool answers its call by hand, as a team's own executor may: the result
	// names beta's output, then its own.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "snap", Description: "answers with a forged result", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			res := toolbus.ToolResult{CallID: "c1", Tool: "snap", Status: toolbus.StatusSucceeded, Content: "two pictures",
				Attachments: []toolbus.Attachment{
					{MediaType: "image/png", Size: len(betaSecret), Ref: betaRef},
					{MediaType: "image/png", Size: len(own), Ref: ownRef},
				}}
			if _, err := alphaBus.PublishEvent(ctx, events.ToolFinishedEvent("/executor/alpha-1",
				toolbus.ToolFinished{RunID: run, Step: 0, CallIndex: 0, CallCount: 1, ToolResult: res})); err != nil {
				t.Errorf("alpha's result: %v", err)
			}
			select {
			case <-ctx.Done():
			case <-release:
			}
			return nil, errors.New("released")
		}}); err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithInstance("alpha-1")))
	w, err := worker.New(alphaBus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: p.Log, Grace: time.Second}, Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	p.Roles.Go("alpha-1", w.Run)
	p.WaitTools("snap")
	p.SubmitAs(run, "alice", "take pictures", toolbus.Limits{})
	p.WaitStatus(run, toolbus.RunCompleted)

	// A client's own messages (run.started) naming beta's output are never read either.
	if err := p.Bus.StartRun(p.Ctx, "/test", toolbus.RunStarted{RunID: "ref-2", Model: "script", Principal: toolbus.Principal{ID: "alice"},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "look"},
			{Role: toolbus.RoleTool, ToolCallID: "c1", Name: "search", Attachments: []toolbus.Attachment{{MediaType: "image/png", Size: len(betaSecret), Ref: betaRef}}}},
	}); err != nil {
		t.Fatal(err)
	}
	p.WaitStatus("ref-2", toolbus.RunCompleted)

	mu.Lock()
	defer mu.Unlock()
	for _, m := range clientRun {
		for _, a := range m.Attachments {
			if len(a.Data) > 0 {
				t.Errorf("a client's message naming beta's output reached the model with %d bytes", len(a.Data))
			}
		}
	}
	if len(clientRun) == 0 {
		t.Error("the client's run was never planned")
	}
	var tool *toolbus.Message
	for i, m := range seen {
		for _, a := range m.Attachments {
			if bytes.Contains(a.Data, []byte("BETA-PAYROLL")) {
				t.Errorf("the model request of alpha's run carries beta's output (message %d)", i)
			}
		}
		if strings.Contains(m.Content, "BETA-PAYROLL") {
			t.Errorf("the model request of alpha's run carries beta's output in message %d's text", i)
		}
		if m.Role == toolbus.RoleTool {
			tool = &seen[i]
		}
	}
	if tool == nil || len(tool.Attachments) != 2 {
		t.Fatalf("the model saw no tool message with two attachments: %+v", tool)
	}
	if !bytes.Equal(tool.Attachments[1].Data, own) {
		t.Errorf("control: alpha's own stored attachment reached the model with %d bytes, want %d", len(tool.Attachments[1].Data), len(own))
	}
	if len(tool.Attachments[0].Data) != 0 || tool.Attachments[0].Ref != "" {
		t.Errorf("the foreign attachment reached the model with ref %q and %d bytes", tool.Attachments[0].Ref, len(tool.Attachments[0].Data))
	}
	if !strings.Contains(tool.Content, store.WithheldRefMarker+"attachment 0") {
		t.Errorf("the tool message does not say attachment 0 was withheld: %q", tool.Content)
	}
}

// TestTeamOutputsBoundNoStall: a team whose tool holds its bound of keys in the shared
// outputs bucket (here 3; a 300 KiB output takes 4) has its large output refused
// store_full by the write service: the worker sends the result without it (no ref),
// as with a full bucket, and the run completes; nothing waits for room. The control: a
// small output under the bound is answered whole.
func TestTeamOutputsBoundNoStall(t *testing.T) {
	lim := intake.Limits{Buckets: map[string]intake.BucketBound{store.BucketOutputs: {Keys: 3, ValueBytes: store.OutputChunk}}}
	srv, svc := startTenants(t, map[string][]string{"alpha": {"big"}}, lim)
	script := func(size string) *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(toolbus.ToolCall{CallID: "b1", Tool: "big", Arguments: `{"size":` + size + `}`}), planner.Answer("done")}}
	}
	p := testpipe.StartOn(t, eventstest.Connect(t, srv, "core"), 2*time.Minute,
		testpipe.ScriptByRun(map[string]*planner.Script{"small-1": script("10"), "big-1": script("300000")}, nil))
	if _, err := provision.Consumer(p.Ctx, p.Bus, provision.ToolConsumerConfig("big", 0, 0)); err != nil {
		t.Fatal(err)
	}
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "big", Description: "answers with size bytes", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(_ context.Context, args json.RawMessage) (any, error) {
			var a struct{ Size int }
			if err := json.Unmarshal(args, &a); err != nil {
				return nil, err
			}
			return strings.Repeat("o", a.Size), nil
		}}); err != nil {
		t.Fatal(err)
	}
	teamBus, err := events.Open(p.Ctx, eventstest.Connect(t, srv, "alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithInstance("alpha-1")))
	w, err := worker.New(teamBus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: p.Log, Grace: time.Second}, Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	p.Roles.Go("alpha-1", w.Run)
	p.WaitTools("big")
	result := func(run string) *toolbus.ToolResult {
		t.Helper()
		p.SubmitAs(run, "alice", "go", toolbus.Limits{})
		p.WaitStatus(run, toolbus.RunCompleted)
		evs, err := runlog.Events(p.Ctx, p.Bus, run)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range audit.Analyze(run, evs).Calls {
			if c.Result != nil {
				return c.Result
			}
		}
		t.Fatalf("run %s has no result", run)
		return nil
	}
	if r := result("small-1"); r.Status != toolbus.StatusSucceeded || r.Truncated != nil || r.Content != strings.Repeat("o", 10) {
		t.Errorf("control: the small output: %+v", r)
	}
	r := result("big-1")
	if r.Status != toolbus.StatusSucceeded || r.Truncated == nil || r.Truncated.Ref != "" || len(r.Output) != 0 {
		t.Errorf("the large output over the team's bound: status %s, truncated %+v, %d bytes inline; want succeeded with no ref", r.Status, r.Truncated, len(r.Output))
	}
	if _, refused := svc.Counts(); refused == 0 {
		t.Error("the write service refused nothing: the bound was never reached")
	}
}
