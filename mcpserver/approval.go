package mcpserver

import (
	"context"
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
)

// A call that needs approval asks the host's user: an input request (an elicitation
// form) in an input_required result (2026-07-28), in a task's inputRequests, or sent as
// elicitation/create by the SDK to an older client that declared elicitation. The
// answer becomes the decision `toolbus approve|deny|respond` would publish, made by the
// caller's identity.

// ApprovalKey is the key of the approval's input request (inputRequests) and of its
// answer (inputResponses).
const ApprovalKey = "toolbus_approval"

// The fields of the approval form (ElicitResult.content).
const (
	FieldDecision  = "decision"  // approve, deny, edit or respond
	FieldArguments = "arguments" // edit: the arguments the call runs with (one JSON object)
	FieldResponse  = "response"  // respond: the answer in the tool's place
	FieldReason    = "reason"    // why (the model reads it on a denial)
)

// canElicit reports whether caps let the server ask the user with a form.
func canElicit(caps *mcp.ClientCapabilities) bool {
	if caps == nil || caps.Elicitation == nil {
		return false
	}
	e := caps.Elicitation
	return e.Form != nil || e.URL == nil // {} means form (2025-06-18)
}

// approvalRequest is the form asking the user to decide the waiting call of rs; note,
// when set, opens the message (why the form is asked again).
func approvalRequest(rs *toolbus.RunStarted, note string) *mcp.ElicitParams {
	call := rs.Calls[0]
	msg := fmt.Sprintf("%s needs approval: run %s, call %s, arguments %s. Approve it, deny it, edit its arguments or answer in the tool's place (it waits until %s).",
		call.Tool, rs.RunID, call.CallID, audit.OneLine(call.Arguments, 400), rs.Limits.Deadline.Format(time.RFC3339))
	if note != "" {
		msg = note + "\n" + msg
	}
	return &mcp.ElicitParams{Mode: "form", Message: msg, RequestedSchema: map[string]any{
		"type": "object",
		"properties": map[string]any{
			FieldDecision: map[string]any{"type": "string", "title": "Decision",
				"enum":        []string{"approve", "deny", "edit", "respond"},
				"description": "approve: the call runs; deny: it does not; edit: it runs with the arguments below; respond: it does not run and the answer below is its result"},
			FieldArguments: map[string]any{"type": "string", "title": "Arguments (edit)", "default": call.Arguments,
				"description": "one JSON object, checked against the tool's input schema"},
			FieldResponse: map[string]any{"type": "string", "title": "Answer (respond)",
				"description": "the call's result in the tool's place"},
			FieldReason: map[string]any{"type": "string", "title": "Reason",
				"description": "why (kept with the decision; the model reads it on a denial)"},
		},
		"required": []string{FieldDecision},
	}}
}

// askApproval is the input_required answer to a call that waits for approval, with the
// sealed requestState (state.go) that resumes it.
func askApproval(rs *toolbus.RunStarted, note, state string) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Content:       []mcp.Content{}, // not null; no content goes with input requests
		InputRequests: mcp.InputRequestMap{ApprovalKey: approvalRequest(rs, note)},
		RequestState:  state,
	}
}

// instructions is the answer to a call that waits for a decision the host cannot ask
// its user for: how to decide it with the CLI.
func instructions(rs *toolbus.RunStarted) *mcp.CallToolResult {
	return errorResult(instructionsText(rs))
}

// instructionsText says how to decide the waiting call of rs with the CLI.
func instructionsText(rs *toolbus.RunStarted) string {
	run, call := rs.RunID, callrun.CallID
	return fmt.Sprintf("%s needs approval: run %s, call %s waits for it until %s. Decide it with `%s`; `toolbus replay %s` shows the result.",
		rs.Calls[0].Tool, run, call, rs.Limits.Deadline.Format(time.RFC3339), decide.ApproveCommand(run, call), run)
}

// errNoDecision is an answer that decides nothing (the user dismissed the form).
var errNoDecision = errors.New("no decision")

// decisionOf maps the user's answer to the form to the decision on the call of run,
// made by who.
func decisionOf(res *mcp.ElicitResult, run, who string) (toolbus.Approval, bool, error) {
	a := toolbus.Approval{RunID: run, CallID: callrun.CallID, Who: who}
	field := func(k string) string {
		s, _ := res.Content[k].(string)
		return strings.TrimSpace(s)
	}
	a.Why = field(FieldReason)
	switch res.Action {
	case "cancel":
		return a, false, errNoDecision
	case "decline":
		if a.Why == "" {
			a.Why = "declined by " + who + " in the MCP host"
		}
		return a, false, nil
	case "accept":
	default:
		return a, false, fmt.Errorf("unknown action %q (accept, decline or cancel)", res.Action)
	}
	switch d := field(FieldDecision); d {
	case "approve":
		return a, true, nil
	case "deny":
		if a.Why == "" {
			a.Why = "denied by " + who + " in the MCP host"
		}
		return a, false, nil
	case "edit":
		if a.Arguments = field(FieldArguments); a.Arguments == "" {
			return a, false, errors.New("edit: give the arguments (one JSON object)")
		}
		return a, true, nil
	case "respond":
		if a.Response = field(FieldResponse); a.Response == "" {
			return a, false, errors.New("respond: give the answer (the call's result)")
		}
		return a, false, nil
	default:
		return a, false, fmt.Errorf("unknown decision %q (approve, deny, edit or respond)", d)
	}
}

// decideFrom publishes the decision the user's answer res makes on the waiting call of
// rs, as `toolbus approve|deny|respond` would. A refusal the user can correct (an
// invalid edit, an empty answer) is returned as a note to ask again with; a call that
// no longer waits (decided elsewhere, ended) is no error: the run says what happened.
func (b *bridge) decideFrom(ctx context.Context, rs *toolbus.RunStarted, who string, res *mcp.ElicitResult) (note string, err error) {
	if b.cfg.CLIApprovalsOnly {
		return "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "decisions over MCP are off (TOOLBUS_MCP_HOST_APPROVALS=false): " + instructionsText(rs)}
	}
	a, granted, err := decisionOf(res, rs.RunID, who)
	if errors.Is(err, errNoDecision) {
		return "", err
	}
	if err != nil {
		return "Refused: " + err.Error() + ".", nil
	}
	bus, err := b.as(ctx, who)
	if err != nil {
		return "", err
	}
	step, call, err := b.waiting(ctx, bus, rs.RunID)
	var refused *decide.RefusedError
	if errors.As(err, &refused) {
		b.cfg.Logger.Info("mcp decision not published", "run_id", rs.RunID, "reason", refused.Msg)
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if a.Arguments == call.Arguments {
		a.Arguments = "" // the form shows the model's arguments: unchanged, it is an approval
	}
	if a.Arguments != "" {
		if err := decide.CheckEdit(ctx, bus, call, a.Arguments); err != nil {
			if errors.As(err, &refused) {
				return "Refused: " + refused.Msg + ".", nil
			}
			return "", err
		}
	}
	if _, err := bus.PublishApproval(ctx, b.cfg.Source, step, a, granted); err != nil {
		return "", fmt.Errorf("mcp: publish the decision: %w", err)
	}
	b.cfg.Logger.Info("mcp decision", "run_id", rs.RunID, "decision", a.Kind(granted), "who", who)
	return "", nil
}

// waiting finds the call of run waiting for a decision; the injector records the wait
// just after the executor announces it, so a refusal is read again for a few seconds.
func (b *bridge) waiting(ctx context.Context, bus *events.Bus, run string) (int, toolbus.ToolCall, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		step, call, err := decide.Waiting(ctx, bus, run, callrun.CallID)
		var refused *decide.RefusedError
		if !errors.As(err, &refused) || time.Now().After(deadline) {
			return step, call, err
		}
		select {
		case <-ctx.Done():
			return 0, toolbus.ToolCall{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ownRun returns the run.started of the MCP call run if the caller's token started it;
// any other run (unknown, not an MCP call, another principal's, another token's of the
// same name) is the same "not found".
func (b *bridge) ownRun(ctx context.Context, run string, c caller) (*toolbus.RunStarted, error) {
	notFound := &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("no MCP call %q of yours", run)}
	if !strings.HasPrefix(run, "mcp-") || !toolbus.ValidRunID(run) {
		return nil, notFound
	}
	bus, err := b.as(ctx, c.id)
	if err != nil {
		return nil, notFound
	}
	rs, err := bus.RunStarted(ctx, run)
	if err != nil || rs.Principal.ID != c.id || rs.Principal.Attrs[OwnerAttr] != c.owner || len(rs.Calls) != 1 {
		return nil, notFound
	}
	return rs, nil
}

// resume answers the retry of a tools/call after input_required: requestState (sealed,
// state.go) names the run and what it asked; the answer in inputResponses answers the
// question or decides the call, once, then the run is followed as on the first round.
func (b *bridge) resume(ctx context.Context, req *mcp.CallToolRequest, c caller) (*mcp.CallToolResult, error) {
	who := c.id
	st, err := b.states.open(req.Params.RequestState, c.owner, requestHash(req.Params))
	if err != nil {
		b.cfg.Logger.Info("mcp requestState refused", "principal", who, "error", err)
		return nil, stateError(err)
	}
	rs, err := b.ownRun(ctx, st.Run, c)
	if err != nil {
		return nil, err
	}
	if st.Seq > 0 {
		q := questionMark{st.Attempt, st.Seq}
		if err := b.answerFrom(ctx, req.Params.InputResponses, rs, st.Seq-max(st.N, 1)+1, st.Seq, who, false); err != nil {
			return nil, err
		}
		return b.follow(ctx, req, rs, who, true, q)
	}
	bus, err := b.as(ctx, who)
	if err != nil {
		return nil, err
	}
	if _, _, err := b.waiting(ctx, bus, rs.RunID); err != nil {
		// A decided call no longer waits: the state was used (or the run moved on).
		return nil, stateError(fmt.Errorf("%w: it was used (the call no longer waits for a decision)", ErrState))
	}
	res, _ := req.Params.InputResponses[ApprovalKey].(*mcp.ElicitResult)
	if res == nil {
		return askApproval(rs, "Please answer the approval form.", b.approvalState(req, c, rs.RunID)), nil
	}
	note, err := b.decideFrom(ctx, rs, who, res)
	switch {
	case errors.Is(err, errNoDecision):
		return instructions(rs), nil
	case err != nil:
		return nil, err
	case note != "":
		return askApproval(rs, note, b.approvalState(req, c, rs.RunID)), nil
	}
	return b.follow(ctx, req, rs, who, true, questionMark{})
}

// approvalState is the sealed requestState of the approval form of run's call, for
// caller c's request req.
func (b *bridge) approvalState(req *mcp.CallToolRequest, c caller, run string) string {
	return b.states.seal(stateClaims{Run: run, Owner: c.owner, Req: requestHash(req.Params)})
}

// questionState is the sealed requestState of the n questions of run's call asked
// together up to m (one: n is 1; key is the first's input key).
func (b *bridge) questionState(req *mcp.CallToolRequest, c caller, run string, m questionMark, n int, key string) string {
	if n == 1 {
		n = 0
	}
	return b.states.seal(stateClaims{Run: run, Owner: c.owner, Req: requestHash(req.Params), Attempt: m.attempt, Seq: m.seq, N: n, Key: key})
}
