package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
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

// inputKey is the key of q's input request: the tool's name for it, else QuestionKey.
func inputKey(q toolbus.ToolQuestion) string {
	if q.Key != "" {
		return q.Key
	}
	return QuestionKey
}

// askQuestion is the input_required result that asks the host's user q, with the
// sealed requestState that resumes it.
func askQuestion(q toolbus.ToolQuestion, state string) *mcp.CallToolResult {
	var schema map[string]any
	_ = json.Unmarshal(q.Schema, &schema) //nolint:errcheck // the executor checked it is an object schema
	return &mcp.CallToolResult{
		Content:       []mcp.Content{},
		InputRequests: mcp.InputRequestMap{inputKey(q): &mcp.ElicitParams{Message: q.Message, RequestedSchema: schema}},
		RequestState:  state,
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

// answerFrom publishes the host's answer (responses under key) to question m of
// the call of rs, as who, once: a question answered before (a replayed requestState) is
// refused with ErrState.
func (b *bridge) answerFrom(ctx context.Context, responses mcp.InputResponseMap, rs *toolbus.RunStarted, m questionMark, key, who string) error {
	a := toolbus.ToolAnswer{RunID: rs.RunID, CallID: callrun.CallID, Tool: rs.Calls[0].Tool, Attempt: m.attempt, Seq: m.seq, Who: who, Action: "cancel"}
	res, _ := responses[key].(*mcp.ElicitResult)
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
	evs, err := bus.RunEvents(ctx, rs.RunID)
	if err != nil {
		return fmt.Errorf("mcp: read the run's questions: %w", err)
	}
	if _, answered := decide.QuestionsOf(evs).Answer(decide.QuestionKey{CallID: callrun.CallID, Seq: m.seq}); answered {
		return stateError(fmt.Errorf("%w: it was used (the question is answered)", ErrState))
	}
	ack, err := bus.PublishEvent(ctx, events.ToolAnswerEvent(b.cfg.Source, a))
	if err != nil {
		return fmt.Errorf("mcp: publish the answer: %w", err)
	}
	if ack.Duplicate {
		return stateError(fmt.Errorf("%w: it was used (the question is answered)", ErrState))
	}
	b.cfg.Logger.Info("mcp answer", "run_id", rs.RunID, "seq", m.seq, "action", a.Action, "who", who)
	return nil
}

// openQuestion returns the question of rs's call that waits for an answer, if any.
func openQuestion(evs []events.StoredEvent) (toolbus.ToolQuestion, bool) {
	qs := decide.QuestionsOf(evs)
	q, asked := qs.Last(callrun.CallID)
	if !asked || qs.Ended() || qs.Finished(callrun.CallID) {
		return q, false
	}
	_, answered := qs.Answer(decide.KeyOf(q))
	return q, !answered
}
