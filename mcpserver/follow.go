package mcpserver

import (
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// follow watches the run of an MCP call until it can answer the request: the call's
// result; when the call waits for approval, the approval form (input_required) if the
// client can ask its user, else a task if the request takes tasks, else how to decide
// it with the CLI; and a task when the request takes tasks and the call outlasts
// TaskAfter; a question of the call's tool (tool.question) after asked goes to the host
// as an input_required form when it can show one, else is answered cancel with the
// reason. decided: the caller's decision on the call, or an answer, was just published
// (a retry after input_required), so its approval wait asks nothing again. While the
// call runs, its progress reports go to the host as progress notifications when the
// request carries a progressToken, and its log lines as log notifications. A request cancelled (or a host gone) before the answer cancels the
// run, so its call is cancelled too.
func (b *bridge) follow(ctx context.Context, req *mcp.CallToolRequest, rs *toolbus.RunStarted, who string, decided bool, asked questionMark) (*mcp.CallToolResult, error) {
	run := rs.RunID
	bus, err := b.as(ctx, who)
	if err != nil {
		return nil, err
	}
	watch, err := runlog.Watch(ctx, bus, events.SubjectRun(run), true)
	if err != nil {
		return nil, fmt.Errorf("mcp: %w", err)
	}
	caps, asTask := req.ClientCapabilities(), takesTasks(req)
	c := callerOfExtra(req.Extra, b.cfg.Principal)
	var answer *mcp.CallToolResult
	k := &asking{b: b, req: req, rs: rs, c: c, bus: bus, asTask: asTask, mark: asked}
	own := callrun.NewOwn()
	v := audit.Visitor{
		ToolProgress: b.progressForwarder(ctx, req, run, own, &answer),
		ToolLog:      b.logForwarder(ctx, req, run, own, &answer),
		ToolQuestion: func(_ runlog.StoredEvent, q toolbus.ToolQuestion) {
			if answer == nil && own.Is(q.Step, q.CallID, q.Tool) {
				answer = k.visit(ctx, q)
			}
		},
		ToolFinished: func(_ runlog.StoredEvent, tf toolbus.ToolFinished) {
			if own.Is(tf.Step, tf.CallID, tf.Tool) {
				answer = b.toolResult(ctx, bus, callOwner(rs), tf.ToolResult)
				answer.Meta = mcp.Meta{MetaRun: run, MetaCall: callrun.CallID}
			}
		},
		ToolWaiting: func(_ runlog.StoredEvent, tw toolbus.ToolWaiting) {
			switch {
			case !own.Is(tw.Step, tw.Call.CallID, tw.Call.Tool):
			case decided:
			case !b.cfg.CLIApprovalsOnly && canElicit(caps):
				answer = askApproval(rs, "", b.approvalState(req, c, run))
			case asTask:
				answer = taskHandle(run)
			default:
				answer = instructions(rs)
			}
		},
		RunEnded: func(_ runlog.StoredEvent, re toolbus.RunEnded) {
			if re.Status.Terminal() {
				answer = errorResult(fmt.Sprintf("run %s ended %s before the call answered: %s %s", run, re.Status, re.Code, re.Reason))
			}
		},
	}
	taskAt := time.Now().Add(b.taskAfter(rs))
	for answer == nil {
		if k.missing != "" {
			return nil, missingCapability(k.missing)
		}
		wait := time.Second
		if asTask {
			if wait = min(wait, time.Until(taskAt)); wait <= 0 {
				return taskHandle(run), nil
			}
		}
		ev, ok, err := watch.Next(ctx, wait)
		if err != nil {
			if ctx.Err() != nil {
				// The host cancelled or went away: cancel the run, so the call is too.
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_, _ = bus.PublishCancel(cctx, b.cfg.Source, toolbus.Cancel{RunID: run, Reason: "the MCP request was cancelled", Who: who}) //nolint:errcheck // best effort
				cancel()
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("mcp: %w", err)
		}
		if ok {
			own.Visit(ev)
			v.Visit(ev)
		}
	}
	return answer, nil
}

// progressForwarder forwards the call's tool.progress events as notifications/progress
// when the host asked for progress (a progressToken), until the request is answered;
// progress must increase, so a report that does not move done forward is not sent.
func (b *bridge) progressForwarder(ctx context.Context, req *mcp.CallToolRequest, run string, own *callrun.Own, answer **mcp.CallToolResult) func(runlog.StoredEvent, toolbus.ToolProgress) {
	token := req.Params.GetProgressToken()
	sent := -1.0
	return func(_ runlog.StoredEvent, tp toolbus.ToolProgress) {
		if token == nil || *answer != nil || !own.Is(tp.Step, tp.CallID, tp.Tool) || tp.Done <= sent || req.Session == nil {
			return
		}
		sent = tp.Done
		if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: token, Progress: tp.Done, Total: tp.Total, Message: tp.Message,
		}); err != nil {
			b.cfg.Logger.Debug("mcp progress not sent", "run_id", run, "error", err)
		}
	}
}

// logForwarder forwards the call's tool.log events to the host as notifications/message
// until the request is answered; the session sends only those at or above the level the
// host set with logging/setLevel (none before it set one). The lines were redacted by
// the executor, as results are.
func (b *bridge) logForwarder(ctx context.Context, req *mcp.CallToolRequest, run string, own *callrun.Own, answer **mcp.CallToolResult) func(runlog.StoredEvent, toolbus.ToolLog) {
	return func(_ runlog.StoredEvent, tl toolbus.ToolLog) {
		if *answer != nil || !own.Is(tl.Step, tl.CallID, tl.Tool) || req.Session == nil {
			return
		}
		var data any = tl.Message
		if len(tl.Attrs) > 0 {
			data = map[string]any{"message": tl.Message, "attrs": tl.Attrs}
		}
		if err := req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: mcp.LoggingLevel(tl.Level), Logger: tl.Tool, Data: data}); err != nil {
			b.cfg.Logger.Debug("mcp log line not sent", "run_id", run, "error", err)
		}
	}
}

// given reports whether the request that started the call (no requestState) carries an
// answer to q under the tool's name for it: the host answered before it was asked.
func given(req *mcp.CallToolRequest, q toolbus.ToolQuestion) bool {
	if q.Key == "" || req.Params.RequestState != "" {
		return false
	}
	_, ok := req.Params.InputResponses[q.Key]
	return ok
}

// taskAfter is how long a call of rs is followed before a request that takes tasks is
// answered with one: at once for a long-running tool (its contract's heartbeat_timeout:
// the tools MCP calls task-supporting), else TaskAfter.
func (b *bridge) taskAfter(rs *toolbus.RunStarted) time.Duration {
	if tc, ok := b.cat.Lookup(rs.Calls[0].Tool); ok && (tc.HeartbeatTimeout > 0 || tc.TaskRequired) {
		return 0
	}
	return b.cfg.TaskAfter
}
