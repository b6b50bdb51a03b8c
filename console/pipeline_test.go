package console

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/planner"
)

// pipeline is a whole pipeline (executor, planner, injector) on an embedded server: the
// runs the console shows. Its model follows a script per run id.
type pipeline struct {
	*testpipe.Pipeline
	t   *testing.T
	ctx context.Context
	srv *eventstest.Bus
	bus *events.Bus
}

// pipelineDeadline bounds a pipeline's life (its workers stop then); a load test raises
// it. No test of this package runs in parallel.
var pipelineDeadline = 5 * time.Minute

// startPipeline starts the workers on a fresh server: the demo and diag packs and extra
// tools on one executor instance ("exec-1"), a planner whose model follows scripts by
// run id, and an injector.
func startPipeline(t *testing.T, scripts map[string]*planner.Script, extra ...executor.Tool) *pipeline {
	t.Helper()
	tp := testpipe.Start(t, pipelineDeadline, testpipe.ScriptByRun(scripts, nil), extra...)
	return &pipeline{Pipeline: tp, t: t, ctx: tp.Ctx, srv: tp.Srv, bus: tp.Bus}
}

// startPipelineOn is startPipeline on a connection that may set the bus up (admin).
func startPipelineOn(t *testing.T, nc *nats.Conn, scripts map[string]*planner.Script, extra ...executor.Tool) *pipeline {
	t.Helper()
	tp := testpipe.StartOn(t, nc, pipelineDeadline, testpipe.ScriptByRun(scripts, nil), extra...)
	return &pipeline{Pipeline: tp, t: t, ctx: tp.Ctx, bus: tp.Bus}
}

// submit starts run with the question "question for <run>" (principal "tester").
func (p *pipeline) submit(run string, limits toolbus.Limits) {
	p.t.Helper()
	p.SubmitAs(run, "tester", "question for "+run, limits)
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Fatalf("%s: output lacks %q:\n%s", what, w, got)
		}
	}
}

// deployTool deploys a service and needs approval.
func deployTool() executor.Tool {
	return executor.Tool{
		Name: "deploy", Description: "deploys a service (needs approval)", NeedsApproval: true,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"service":{"type":"string"}}}`),
		Func: func(_ context.Context, args json.RawMessage) (any, error) {
			var in struct{ Service string }
			_ = json.Unmarshal(args, &in)
			return map[string]string{"deployed": in.Service}, nil
		},
	}
}

func call(id, tool, args string) toolbus.ToolCall {
	return toolbus.ToolCall{CallID: id, Tool: tool, Arguments: args}
}

// crawlTool is a long-running tool that reports progress every 50ms until release is
// closed, then answers.
func crawlTool(release <-chan struct{}) executor.Tool {
	return executor.Tool{Name: "crawl", Description: "crawls until released, reporting progress", ReadOnly: true,
		InputSchema: json.RawMessage(`{"type":"object"}`), Timeout: 2 * time.Minute, HeartbeatTimeout: 10 * time.Second,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			for n := 1; ; n++ {
				if err := executor.Progress(ctx, float64(n), 0, fmt.Sprintf("page %d", n)); err != nil {
					return nil, err
				}
				select {
				case <-release:
					return "crawled", nil
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		}}
}
