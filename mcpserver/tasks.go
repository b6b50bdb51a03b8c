package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
)

// The Tasks extension (io.modelcontextprotocol/tasks, with the 2026-07-28 protocol): a
// tools/call whose request declares the extension and that outlasts TaskAfter (or that
// waits for a decision the host cannot ask its user for) is answered with a task: its
// id is the call's run id, its state is read from the run's events (so any `toolbus
// mcp` serves it, after a reconnect or a restart), tasks/update decides a call waiting
// for approval and tasks/cancel publishes run.cancel.

// ExtTasks is the identifier of the Tasks extension.
const ExtTasks = "io.modelcontextprotocol/tasks"

// The statuses of a task.
const (
	TaskWorking       = "working"
	TaskInputRequired = "input_required"
	TaskCompleted     = "completed"
	TaskCancelled     = "cancelled"
	// TaskFailed: the tool broke (toolbus.CodeToolInternalError: a panic, an output it
	// could not encode), a protocol-level failure; a tool's own error is completed with
	// isError.
	TaskFailed = "failed"
)

// Task is the state of the task of an MCP call: the CreateTaskResult of its tools/call
// (ResultType "task") and the answer to tasks/get (ResultType "complete").
type Task struct {
	mcp.ResultBase
	ResultType    string `json:"resultType"`
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	// TTLMs is null: a task lasts as long as its run's events are kept.
	TTLMs          *int64 `json:"ttlMs"`
	PollIntervalMs int64  `json:"pollIntervalMs,omitempty"`
	// InputRequests (input_required) is the approval form of a call waiting for a decision.
	InputRequests mcp.InputRequestMap `json:"inputRequests,omitempty"`
	// Result (completed) is the call's result, as tools/call would have answered.
	Result *mcp.CallToolResult `json:"result,omitempty"`
	// Error (failed) is the JSON-RPC error of a tool that broke.
	Error *TaskError `json:"error,omitempty"`
}

// TaskError is the error of a failed task (a JSON-RPC error object).
type TaskError struct {
	Code    int64  `json:"code"`
	Message string `json:"message"`
}

// TaskParams are the params of tasks/get, tasks/update (with InputResponses) and
// tasks/cancel.
type TaskParams struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"`
	// InputResponses are read one by one (elicitResponse): a response under a key the
	// task did not ask is ignored, whatever its shape.
	InputResponses map[string]json.RawMessage `json:"inputResponses,omitempty"`
}

// elicitResponse is the answer to a form under key, if one is there.
func elicitResponse(responses map[string]json.RawMessage, key string) (*mcp.ElicitResult, bool) {
	raw, ok := responses[key]
	if !ok {
		return nil, false
	}
	var res mcp.ElicitResult
	if err := json.Unmarshal(raw, &res); err != nil || res.Action == "" {
		return nil, false
	}
	return &res, true
}

// TaskAck is the empty answer to tasks/update and tasks/cancel.
type TaskAck struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

// metaTaskHandle marks (inside the server only) a tools/call answer to be replaced by
// the CreateTaskResult of the named run (taskResults).
const metaTaskHandle = "toolbus/task-handle"

func taskHandle(run string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Meta: mcp.Meta{metaTaskHandle: run}}
}

// declaresTasks reports whether a request's _meta declares the Tasks extension in its
// per-request client capabilities.
func declaresTasks(meta mcp.Meta) bool {
	raw, err := json.Marshal(meta[mcp.MetaKeyClientCapabilities])
	if err != nil {
		return false
	}
	var caps struct {
		Extensions map[string]json.RawMessage `json:"extensions"`
	}
	_ = json.Unmarshal(raw, &caps) //nolint:errcheck // no capabilities, no tasks
	_, ok := caps.Extensions[ExtTasks]
	return ok
}

// takesTasks reports whether req may be answered with a task: it follows 2026-07-28 or
// later and declares the extension.
func takesTasks(req *mcp.CallToolRequest) bool {
	return req.ProtocolVersion() >= "2026-07-28" && declaresTasks(req.Params.Meta)
}

// taskResults is receiving middleware: a tools/call answer marked by taskHandle becomes
// the CreateTaskResult of its run.
func (b *bridge) taskResults(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		ctr, ok := res.(*mcp.CallToolResult)
		if err != nil || !ok || ctr.Meta == nil {
			return res, err
		}
		run, ok := ctr.Meta[metaTaskHandle].(string)
		if !ok {
			return res, err
		}
		bus, err := b.as(ctx, callerOfExtra(req.GetExtra(), b.cfg.Principal).id)
		if err != nil {
			return nil, err
		}
		rs, err := bus.RunStarted(ctx, run)
		if err != nil {
			return nil, fmt.Errorf("mcp: task %s: %w", run, err)
		}
		var caps *mcp.ClientCapabilities
		if cr, ok := req.(*mcp.CallToolRequest); ok {
			caps = cr.ClientCapabilities()
		}
		t, err := b.taskView(ctx, rs, caps)
		if err != nil {
			return nil, err
		}
		t.ResultType = "task"
		b.cfg.Logger.Info("mcp call answered as a task", "run_id", run, "status", t.Status)
		return t, nil
	}
}

// taskView reads the task of rs's call from its run's events; caps says whether a call
// waiting for approval asks the user (input_required) or tells how to decide it.
func (b *bridge) taskView(ctx context.Context, rs *toolbus.RunStarted, caps *mcp.ClientCapabilities) (*Task, error) {
	// rs is the caller's (ownRun, or a run it just started): read as its principal.
	bus, err := b.as(ctx, rs.Principal.ID)
	if err != nil {
		return nil, err
	}
	evs, err := runlog.Events(ctx, bus, rs.RunID)
	if err != nil {
		return nil, fmt.Errorf("mcp: task %s: %w", rs.RunID, err)
	}
	t := &Task{TaskID: rs.RunID, Status: TaskWorking, PollIntervalMs: b.cfg.TaskPollInterval.Milliseconds(),
		CreatedAt: rs.StartedAt.UTC().Format(time.RFC3339Nano)}
	t.Meta = mcp.Meta{MetaRun: rs.RunID, MetaCall: callrun.CallID}
	last, waiting, waitStep := rs.StartedAt, false, 0
	var (
		finished  *toolbus.ToolResult
		ended     *toolbus.RunEnded
		cancelled string // the run.cancel's reason
	)
	own := callrun.NewOwn()
	v := audit.Visitor{
		ToolProgress: func(_ runlog.StoredEvent, tp toolbus.ToolProgress) {
			if own.Is(tp.Step, tp.CallID, tp.Tool) {
				t.StatusMessage = progressText(tp)
			}
		},
		ToolWaiting: func(_ runlog.StoredEvent, tw toolbus.ToolWaiting) {
			if own.Is(tw.Step, tw.Call.CallID, tw.Call.Tool) {
				waiting, waitStep = true, tw.Step
			}
		},
		ToolFinished: func(_ runlog.StoredEvent, tf toolbus.ToolFinished) {
			if own.Is(tf.Step, tf.CallID, tf.Tool) {
				r := tf.ToolResult
				finished = &r
			}
		},
		RunEnded: func(_ runlog.StoredEvent, re toolbus.RunEnded) {
			if re.Status.Terminal() {
				ended = &re
			}
		},
		Cancel: func(_ runlog.StoredEvent, c toolbus.Cancel) {
			if cancelled == "" && rs.NamesDecider(c.Who) { // anyone may write one naming the run
				cancelled = fmt.Sprintf("%s (by %s)", c.Reason, c.Who)
			}
		},
	}
	for _, ev := range evs {
		last = ev.Time
		own.Visit(ev)
		v.Visit(ev)
	}
	t.LastUpdatedAt = last.UTC().Format(time.RFC3339Nano)
	if waiting {
		if d, ok, err := standingDecision(ctx, bus, rs.RunID, waitStep); err != nil {
			return nil, err
		} else if ok {
			waiting, t.StatusMessage = false, d.Kind(d.Granted)+" by "+d.Who
		}
	}
	open := openQuestions(evs)
	var askable []toolbus.ToolQuestion
	for _, q := range open {
		if _, ok := questionCapability(caps, q); ok {
			askable = append(askable, q)
		}
	}
	switch {
	case ended != nil && ended.Status == toolbus.RunCancelled, finished != nil && finished.Status == toolbus.StatusCancelled:
		t.Status, t.StatusMessage = TaskCancelled, cancelled
		if ended != nil {
			t.StatusMessage = ended.Reason
		}
	case finished != nil && finished.Error != nil && finished.Error.Code == toolbus.CodeToolInternalError:
		t.Status, t.Error = TaskFailed, &TaskError{Code: jsonrpc.CodeInternalError, Message: finished.Error.Message}
	case finished != nil:
		t.Status, t.Result = TaskCompleted, b.toolResult(ctx, bus, callOwner(rs), *finished)
		t.Result.Meta = mcp.Meta{MetaRun: rs.RunID, MetaCall: callrun.CallID}
	case ended != nil:
		t.Status = TaskCompleted
		t.Result = errorResult(fmt.Sprintf("run %s ended %s before the call answered: %s %s", rs.RunID, ended.Status, ended.Code, ended.Reason))
	case len(askable) > 0:
		t.Status, t.StatusMessage = TaskInputRequired, "waits for an answer"
		t.InputRequests = askQuestions(askable, "").InputRequests
	case len(open) > 0:
		t.StatusMessage = "waits for an answer: " + decide.AnswerCommand(open[0])
	case waiting && !b.cfg.CLIApprovalsOnly && canElicit(caps):
		t.Status, t.StatusMessage = TaskInputRequired, "waits for approval"
		t.InputRequests = mcp.InputRequestMap{ApprovalKey: approvalRequest(rs, "")}
	case waiting:
		t.StatusMessage = instructionsText(rs)
	}
	return t, nil
}

// standingDecision returns the decision that stood on the door's call of run waiting at step,
// as the injector recorded it (the approvals bucket): an approval event in the run is
// data its writer chose, and a client who may write none that counts (not the run's
// decider) still stores one on its own subject, which must not close the caller's form.
func standingDecision(ctx context.Context, bus *events.Bus, run string, step int) (store.Decision, bool, error) {
	d, err := bus.Store().StepDecision(ctx, run, step, callrun.CallID)
	switch {
	case errors.Is(err, events.ErrNotFound):
		return d, false, nil
	case err != nil:
		return d, false, fmt.Errorf("mcp: task %s: %w", run, err)
	}
	return d, true, nil
}

// progressText says how far a call has come.
func progressText(tp toolbus.ToolProgress) string {
	s := fmt.Sprintf("%g", tp.Done)
	if tp.Total > 0 {
		s += fmt.Sprintf(" of %g", tp.Total)
	}
	if tp.Message != "" {
		s = tp.Message + " (" + s + ")"
	}
	return s
}

// addTaskMethods registers tasks/get, tasks/update and tasks/cancel.
func (b *bridge) addTaskMethods() error {
	return errors.Join(
		mcp.AddReceivingCustomMethod(b.srv, "tasks/get", b.getTask),
		mcp.AddReceivingCustomMethod(b.srv, "tasks/update", b.updateTask),
		mcp.AddReceivingCustomMethod(b.srv, "tasks/cancel", b.cancelTask),
	)
}

// taskRun checks a tasks/* request: it declares the extension and names a task of the
// caller's. It returns the task's run.started and the caller.
func (b *bridge) taskRun(ctx context.Context, p *TaskParams) (*toolbus.RunStarted, string, error) {
	if p == nil || !declaresTasks(p.Meta) {
		return nil, "", missingTasks()
	}
	c, _ := ctx.Value(callerKey{}).(caller)
	rs, err := b.ownRun(ctx, p.TaskID, c)
	if err != nil {
		return nil, "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("Failed to retrieve task: task %q not found", p.TaskID)}
	}
	return rs, c.id, nil
}

func (b *bridge) getTask(ctx context.Context, _ *mcp.ServerSession, p *TaskParams) (*Task, error) {
	rs, _, err := b.taskRun(ctx, p)
	if err != nil {
		return nil, err
	}
	t, err := b.taskView(ctx, rs, capsOf(p.Meta))
	if err != nil {
		return nil, err
	}
	t.ResultType = "complete"
	return t, nil
}

// updateTask decides the task's call waiting for approval with the answer to its form;
// an answer the run refuses (an invalid edit) is an error and the call still waits.
func (b *bridge) updateTask(ctx context.Context, _ *mcp.ServerSession, p *TaskParams) (*TaskAck, error) {
	rs, who, err := b.taskRun(ctx, p)
	if err != nil {
		return nil, err
	}
	if err := b.answerTask(ctx, rs, who, p.InputResponses); err != nil {
		return nil, err
	}
	if res, ok := elicitResponse(p.InputResponses, ApprovalKey); ok {
		note, err := b.decideFrom(ctx, rs, who, res)
		switch {
		case errors.Is(err, errNoDecision):
		case err != nil:
			return nil, err
		case note != "":
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: note + " The call still waits."}
		}
	}
	return &TaskAck{ResultType: "complete"}, nil
}

// answerTask answers the question the task's call waits on with the response under
// its key, if there is one (responses to anything else are ignored).
func (b *bridge) answerTask(ctx context.Context, rs *toolbus.RunStarted, who string, responses map[string]json.RawMessage) error {
	bus, err := b.as(ctx, who)
	if err != nil {
		return err
	}
	evs, err := runlog.Events(ctx, bus, rs.RunID)
	if err != nil {
		return fmt.Errorf("mcp: task %s: %w", rs.RunID, err)
	}
	open, given := openQuestions(evs), mcp.InputResponseMap{}
	for _, q := range open {
		if res, ok := inputResponse(responses[inputKey(q)]); ok {
			given[inputKey(q)] = res
		}
	}
	if len(given) == 0 {
		return nil
	}
	return b.answerFrom(ctx, given, rs, open[0].Seq, open[len(open)-1].Seq, who, true)
}

// cancelTask cancels the task's run (run.cancel, by the caller): its call is cancelled
// and the task ends cancelled, unless the call finished first.
func (b *bridge) cancelTask(ctx context.Context, _ *mcp.ServerSession, p *TaskParams) (*TaskAck, error) {
	rs, who, err := b.taskRun(ctx, p)
	if err != nil {
		return nil, err
	}
	bus, err := b.as(ctx, who)
	if err != nil {
		return nil, err
	}
	if _, err := bus.PublishCancel(ctx, b.cfg.Source, toolbus.Cancel{RunID: rs.RunID, Reason: "tasks/cancel", Who: who}); err != nil {
		return nil, fmt.Errorf("mcp: cancel task %s: %w", rs.RunID, err)
	}
	b.cfg.Logger.Info("mcp task cancelled", "run_id", rs.RunID, "who", who)
	return &TaskAck{ResultType: "complete"}, nil
}

// callerKey is the context key of the caller of a tasks/* request (withCaller).
type callerKey struct{}

// withCaller is receiving middleware: the caller of a tasks/* request (the bearer
// token's identity and owner, else the default principal) goes in its context, where the
// custom methods' handlers, which see no request extra, read it.
func withCaller(def string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if strings.HasPrefix(method, "tasks/") {
				ctx = context.WithValue(ctx, callerKey{}, callerOfExtra(req.GetExtra(), def))
			}
			return next(ctx, method, req)
		}
	}
}
