package decide

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/internal/argcheck"
)

// OpenQuestion finds the question of call callID in run that still waits for an answer
// (Questions.Open): the call's last question, with no answer by the run's principal (the
// executor ignores anyone else's, so theirs leaves the question open) and no result.
// A question is one per step, call and seq whichever attempt asked it: a tool that ran
// again after a restart found it asked and did not ask it again.
func OpenQuestion(ctx context.Context, bus *events.Bus, run, callID string) (toolbus.ToolQuestion, error) {
	evs, err := runlog.Events(ctx, bus, run)
	if err != nil {
		return toolbus.ToolQuestion{}, err
	}
	if len(evs) == 0 {
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("run %s not found", run)}
	}
	qs := QuestionsOf(evs)
	q, asked := qs.Last(callID)
	switch {
	case qs.Ended():
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("run %s already ended", run)}
	case !asked:
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("call %s of run %s asked no question", callID, run)}
	}
	if _, answered := qs.Answer(KeyOf(q)); answered {
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("the question of call %s of run %s was already answered", callID, run)}
	}
	if qs.Finished(callID) {
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("call %s of run %s already finished", callID, run)}
	}
	return q, nil
}

// Answer is who's answer to q: content (one JSON object) checked against the question's
// schema, or, with decline, no content.
func Answer(q toolbus.ToolQuestion, who, content string, decline bool) (toolbus.ToolAnswer, error) {
	a := toolbus.ToolAnswer{RunID: q.RunID, Step: q.Step, CallID: q.CallID, Tool: q.Tool, Attempt: q.Attempt, Seq: q.Seq,
		Action: "decline", Who: who}
	if decline {
		return a, nil
	}
	if err := argcheck.Check(q.Schema, content); err != nil {
		return a, &RefusedError{Msg: fmt.Sprintf("the answer does not match the question's schema: %v", err)}
	}
	a.Action, a.Content = "accept", json.RawMessage(content)
	return a, nil
}
