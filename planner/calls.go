package planner

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// Publishing a step's calls: one tool.requested per call up to the per-step cap, a
// rejected result for each call beyond it or whose tool no executor serves, and the call
// ids that make each call addressable.

// publishCalls publishes one tool.requested per call, up to the per-step cap; each call
// beyond the cap gets a rejected result (too_many_calls) published here, so the step
// still has one result per call and the model reads why.
func (p *Planner) publishCalls(ctx context.Context, rs *toolbus.RunStarted, step int, calls []toolbus.ToolCall, traceparent string, futures []*events.PubFuture) error {
	for i, c := range calls {
		if i >= p.cfg.MaxCallsPerStep {
			f, err := p.rejectExcess(ctx, rs.RunID, step, i, calls, traceparent)
			if err != nil {
				return err
			}
			futures = append(futures, f)
			continue
		}
		_, served := p.catalog.Resolve(ctx, c.Tool)
		f, err := p.bus.PublishEventAsync(ctx, events.ToolRequestedEvent(p.source, toolbus.ToolRequested{
			RunID: rs.RunID, Step: step, CallIndex: i, CallCount: len(calls), Call: c,
			Deadline: rs.Limits.Deadline, Principal: rs.Principal, AllowedTools: rs.AllowedTools,
		}, served).Traced(traceparent))
		if err != nil {
			return err
		}
		futures = append(futures, f)
		if !served {
			// No executor serves it: the call is recorded on tool.requested._unknown,
			// which nobody consumes, and answered here, so it still gets exactly one
			// result and no executor credentials need a result subject shared by
			// every team (where one team could answer another team's calls).
			if f, err = p.rejectUnserved(ctx, rs.RunID, step, i, calls, traceparent); err != nil {
				return err
			}
			futures = append(futures, f)
		}
	}
	return events.AwaitAcks(ctx, futures)
}

// rejectUnserved publishes the rejected result (unknown_tool) of call i, whose tool no
// executor serves: on the tool's own result subject (tool.finished._unknown for a name
// that is not a valid tool name).
func (p *Planner) rejectUnserved(ctx context.Context, run string, step, i int, calls []toolbus.ToolCall, traceparent string) (*events.PubFuture, error) {
	c := calls[i]
	name := c.Tool
	if len(name) > 100 { // the model names tools: keep the message bounded
		name = name[:100] + "..."
	}
	terr := toolbus.ToolError{Code: toolbus.CodeUnknownTool, Message: fmt.Sprintf("no executor serves a tool named %q", name)}
	content, err := json.Marshal(map[string]toolbus.ToolError{"error": terr})
	if err != nil {
		return nil, fmt.Errorf("planner: unknown tool result: %w", err)
	}
	res := toolbus.ToolResult{CallID: c.CallID, Tool: c.Tool, Status: toolbus.StatusRejected, Content: string(content),
		Executor: p.source, Attempt: 1, Error: &terr}
	return p.bus.PublishEventAsync(ctx, events.ToolFinishedEvent(p.source,
		toolbus.ToolFinished{RunID: run, Step: step, CallIndex: i, CallCount: len(calls), ToolResult: res}).Traced(traceparent))
}

// rejectExcess publishes the rejected result of call i, beyond the per-step cap.
func (p *Planner) rejectExcess(ctx context.Context, run string, step, i int, calls []toolbus.ToolCall, traceparent string) (*events.PubFuture, error) {
	c := calls[i]
	msg := fmt.Sprintf("not run: this step asked for %d tool calls and at most %d run per step; ask for the rest in a later step",
		len(calls), p.cfg.MaxCallsPerStep)
	res := toolbus.ToolResult{CallID: c.CallID, Tool: c.Tool, Status: toolbus.StatusRejected, Content: msg, Executor: p.source,
		Error: &toolbus.ToolError{Code: toolbus.CodeTooManyCalls, Message: msg, Retryable: true}}
	return p.bus.PublishEventAsync(ctx, events.ToolFinishedEvent(p.source,
		toolbus.ToolFinished{RunID: run, Step: step, CallIndex: i, CallCount: len(calls), ToolResult: res}).Traced(traceparent))
}

// NormalizeCallIDs gives every call of a step a non-empty id unique within the step,
// keeping the provider's ids where they are already usable. Generated ids are stable
// (derived from step and index) so a retried step produces the same ones.
func NormalizeCallIDs(step int, calls []toolbus.ToolCall) []toolbus.ToolCall {
	seen := make(map[string]bool, len(calls))
	for i := range calls {
		id := calls[i].CallID
		if id == "" || seen[id] || len(id) > 200 {
			base := "call_" + strconv.Itoa(step) + "_" + strconv.Itoa(i)
			id = base
			for n := 1; seen[id]; n++ {
				id = base + "_" + strconv.Itoa(n)
			}
			calls[i].CallID = id
		}
		seen[id] = true
	}
	return calls
}
