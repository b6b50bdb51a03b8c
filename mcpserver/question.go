package mcpserver

import (
	"context"
	"fmt"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
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

// inputKey is the key of q's input request: the tool's name for it, else QuestionKey
// (numbered in a batch).
func inputKey(q toolbus.ToolQuestion) string {
	switch {
	case q.Key != "":
		return q.Key
	case q.BatchSize > 1:
		return fmt.Sprintf("%s_%d", QuestionKey, q.Seq)
	}
	return QuestionKey
}

// askQuestions is the input_required result that asks the host qs (its user's form, its
// model, its roots), with the sealed requestState that resumes them.
func askQuestions(qs []toolbus.ToolQuestion, state string) *mcp.CallToolResult {
	m := mcp.InputRequestMap{}
	for _, q := range qs {
		m[inputKey(q)] = inputRequest(q)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{}, InputRequests: m, RequestState: state}
}

// cannotAsk answers q for a host that did not declare capability: cancel, with the reason.
func (b *bridge) cannotAsk(ctx context.Context, bus *events.Bus, q toolbus.ToolQuestion, capability, who string) {
	what := questionMethod(q)
	if what == toolbus.AskElicit {
		what, capability = "questions", "elicitation (form)"
	}
	a := toolbus.ToolAnswer{RunID: q.RunID, Step: q.Step, CallID: q.CallID, Tool: q.Tool, Attempt: q.Attempt, Seq: q.Seq,
		Action: "cancel", Who: who, Reason: "the MCP client cannot answer " + what + ": it declared no " + capability + " capability"}
	if _, err := bus.PublishEvent(ctx, events.ToolAnswerEvent(b.cfg.Source, a)); err != nil {
		b.cfg.Logger.Warn("mcp: question not answered", "run_id", q.RunID, "error", err)
	}
}

// answerFrom publishes the host's answers (responses, under each question's key) to the
// questions first to last of the call of rs, as who, each once. partial (tasks/update, an
// answer sent with the request) answers only the questions with a response; else a
// question without one is answered cancel. A retry whose questions were all answered
// before (a replayed requestState) is refused with ErrState.
func (b *bridge) answerFrom(ctx context.Context, responses mcp.InputResponseMap, rs *toolbus.RunStarted, first, last int, who string, partial bool) error {
	bus, err := b.as(ctx, who)
	if err != nil {
		return err
	}
	evs, err := runlog.Events(ctx, bus, rs.RunID)
	if err != nil {
		return fmt.Errorf("mcp: read the run's questions: %w", err)
	}
	qs, published := decide.QuestionsOf(evs), 0
	for seq := first; seq <= last; seq++ {
		k := decide.QuestionKey{CallID: callrun.CallID, Seq: seq}
		q, asked := qs.Asked(k)
		if _, answered := qs.Answer(k); !asked || answered {
			continue
		}
		res, ok := responses[inputKey(q)]
		if partial && !ok {
			continue
		}
		a, err := answerOf(q, res)
		if err != nil {
			return err
		}
		a.Who = who
		ack, err := bus.PublishEvent(ctx, events.ToolAnswerEvent(b.cfg.Source, a))
		if err != nil {
			return fmt.Errorf("mcp: publish the answer: %w", err)
		}
		if !ack.Duplicate {
			published++
			b.cfg.Logger.Info("mcp answer", "run_id", rs.RunID, "seq", seq, "action", a.Action, "who", who)
		}
	}
	if published == 0 && !partial {
		return stateError(fmt.Errorf("%w: it was used (the question is answered)", ErrState))
	}
	return nil
}

// openQuestions returns the questions of rs's call that wait for an answer (its last
// question's batch, answered or not one by one), if any.
func openQuestions(evs []runlog.StoredEvent) []toolbus.ToolQuestion {
	qs := decide.QuestionsOf(evs)
	q, asked := qs.Last(callrun.CallID)
	if !asked || qs.Ended() || qs.Finished(callrun.CallID) {
		return nil
	}
	var open []toolbus.ToolQuestion
	for _, b := range qs.Batch(q) {
		if _, answered := qs.Answer(decide.KeyOf(b)); !answered {
			open = append(open, b)
		}
	}
	return open
}

// asking follows the questions of an MCP call's tool for follow: a question asked alone,
// or a batch once all of it was asked, goes to the host as one input_required result of
// what it can answer (an answer sent with the request is published instead); what it
// cannot answer (no capability declared) is answered cancel with the reason, and a
// 2026-07-28 request that can answer none of a batch fails with -32021 (missing).
type asking struct {
	b       *bridge
	req     *mcp.CallToolRequest
	rs      *toolbus.RunStarted
	c       caller
	bus     *events.Bus
	asTask  bool
	mark    questionMark
	batch   map[int]toolbus.ToolQuestion
	missing string // the capability the request lacks
}

// visit reads question q and returns the input_required result that asks it, if any.
func (k *asking) visit(ctx context.Context, q toolbus.ToolQuestion) *mcp.CallToolResult {
	if !k.mark.after(q) {
		return nil
	}
	if k.batch == nil {
		k.batch = map[int]toolbus.ToolQuestion{}
	}
	k.batch[q.Seq] = q
	size := max(q.BatchSize, 1)
	if len(k.batch) < size {
		return nil
	}
	qs := make([]toolbus.ToolQuestion, 0, size)
	attempt := 0
	for _, b := range k.batch {
		qs, attempt = append(qs, b), max(attempt, b.Attempt)
	}
	slices.SortFunc(qs, func(a, b toolbus.ToolQuestion) int { return a.Seq - b.Seq })
	k.batch, k.mark = nil, questionMark{attempt, qs[len(qs)-1].Seq}
	var ask []toolbus.ToolQuestion
	caps, who := k.req.ClientCapabilities(), k.c.id
	missing := ""
	for _, q := range qs {
		if given(k.req, q) {
			// The host sent the answer with its request, under the question's key.
			if err := k.b.answerFrom(ctx, k.req.Params.InputResponses, k.rs, q.Seq, q.Seq, who, true); err != nil {
				k.b.cfg.Logger.Warn("mcp: the answer sent with the request was not published", "run_id", k.rs.RunID, "error", err)
			}
			continue
		}
		capability, ok := questionCapability(caps, q)
		if ok {
			ask = append(ask, q)
			continue
		}
		k.b.cannotAsk(ctx, k.bus, q, capability, who)
		if missing == "" {
			missing = capability
		}
	}
	if len(ask) > 0 {
		return askQuestions(ask, k.b.questionState(k.req, k.c, k.rs.RunID, k.mark, len(qs), inputKey(ask[0])))
	}
	if missing != "" && k.req.ProtocolVersion() >= Protocol2026 && !k.asTask {
		k.missing = missing
	}
	return nil
}
