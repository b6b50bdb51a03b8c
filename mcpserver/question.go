package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/callrun"
)

// A tool's question (tool.question, executor.Ask) goes to the host that called the
// tool as the approval form does: an input request in an input_required result
// (2026-07-28), which the SDK sends as elicitation/create to an older client that
// declared elicitation, then retries the call with the answer (inputResponses), which
// is published as the tool.answer the tool waits for. A host that can show no form gets
// a cancel answer with the reason, so the tool learns at once that nobody can answer.

// QuestionKey is the key of a question's input request and of its answer.
const QuestionKey = "toolbus_question"

// questionMark names a question of the call: its attempt and seq (zero: none).
type questionMark struct{ attempt, seq int }

// after reports whether q comes after m (a question not yet answered in this request).
func (m questionMark) after(q toolbus.ToolQuestion) bool {
	return q.Attempt > m.attempt || q.Attempt == m.attempt && q.Seq > m.seq
}

// questionState is the requestState of the input_required result that asks q.
func questionState(run string, q toolbus.ToolQuestion) string {
	return statePrefix + run + "#q" + strconv.Itoa(q.Attempt) + "." + strconv.Itoa(q.Seq)
}

// parseState splits a requestState into the run and, for a question, its mark.
func parseState(state string) (run string, q questionMark, ok bool) {
	rest, ok := strings.CutPrefix(state, statePrefix)
	if !ok {
		return "", q, false
	}
	run, mark, isQ := strings.Cut(rest, "#q")
	if !isQ {
		return run, q, true
	}
	a, s, _ := strings.Cut(mark, ".")
	var err1, err2 error
	q.attempt, err1 = strconv.Atoi(a)
	q.seq, err2 = strconv.Atoi(s)
	return run, q, err1 == nil && err2 == nil && q.attempt > 0 && q.seq > 0
}

// askQuestion is the input_required result that asks the host's user q.
func askQuestion(run string, q toolbus.ToolQuestion) *mcp.CallToolResult {
	var schema map[string]any
	_ = json.Unmarshal(q.Schema, &schema) //nolint:errcheck // the executor checked it is an object schema
	return &mcp.CallToolResult{
		Content:       []mcp.Content{},
		InputRequests: mcp.InputRequestMap{QuestionKey: &mcp.ElicitParams{Message: q.Message, RequestedSchema: schema}},
		RequestState:  questionState(run, q),
	}
}

// cannotAsk answers q for a host that can show no form: cancel, with the reason.
func (b *bridge) cannotAsk(ctx context.Context, bus *events.Bus, q toolbus.ToolQuestion, who string) {
	a := toolbus.ToolAnswer{RunID: q.RunID, Step: q.Step, CallID: q.CallID, Tool: q.Tool, Attempt: q.Attempt, Seq: q.Seq,
		Action: "cancel", Who: who, Reason: "the MCP client cannot answer questions: it declared no elicitation (form) capability"}
	if _, err := bus.PublishEvent(ctx, events.ToolAnswerEvent(b.cfg.Source, a)); err != nil {
		b.cfg.Logger.Warn("mcp: question not answered", "run_id", q.RunID, "error", err)
	}
}

// answerFrom publishes the host's answer (inputResponses) to question m of the call of
// rs, as who.
func (b *bridge) answerFrom(ctx context.Context, req *mcp.CallToolRequest, rs *toolbus.RunStarted, m questionMark, who string) error {
	a := toolbus.ToolAnswer{RunID: rs.RunID, CallID: callrun.CallID, Tool: rs.Calls[0].Tool, Attempt: m.attempt, Seq: m.seq, Who: who, Action: "cancel"}
	res, _ := req.Params.InputResponses[QuestionKey].(*mcp.ElicitResult)
	if res == nil {
		a.Reason = "the MCP host sent no answer"
	} else {
		a.Action = res.Action
		if res.Action == "accept" {
			c, err := json.Marshal(res.Content)
			if err != nil {
				return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "the answer's content is not JSON: " + err.Error()}
			}
			a.Content = c
		}
	}
	bus, err := b.as(ctx, who)
	if err != nil {
		return err
	}
	if _, err := bus.PublishEvent(ctx, events.ToolAnswerEvent(b.cfg.Source, a)); err != nil {
		return fmt.Errorf("mcp: publish the answer: %w", err)
	}
	b.cfg.Logger.Info("mcp answer", "run_id", rs.RunID, "seq", m.seq, "action", a.Action, "who", who)
	return nil
}
