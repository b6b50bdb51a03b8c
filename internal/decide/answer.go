package decide

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/argcheck"
)

// OpenQuestion finds the question of call callID in run that still waits for an answer:
// the last tool.question of the call (its latest attempt asks again after a restart)
// with no tool.answer by the run's principal to its attempt and seq (the worker ignores
// anyone else's, so theirs leaves the question open).
func OpenQuestion(ctx context.Context, bus *events.Bus, run, callID string) (toolbus.ToolQuestion, error) {
	evs, err := bus.RunEvents(ctx, run)
	if err != nil {
		return toolbus.ToolQuestion{}, err
	}
	if len(evs) == 0 {
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("run %s not found", run)}
	}
	type mark struct{ attempt, seq int }
	var (
		open      *toolbus.ToolQuestion
		answered  = map[mark]bool{}
		ended     bool
		principal string
	)
	v := audit.Visitor{
		RunStarted: func(_ events.StoredEvent, rs toolbus.RunStarted) {
			if principal == "" { // the run's first run.started is the run (a later one is a squat)
				principal = rs.Principal.ID
			}
		},
		ToolQuestion: func(_ events.StoredEvent, q toolbus.ToolQuestion) {
			if q.CallID == callID {
				open = &q
			}
		},
		ToolAnswer: func(_ events.StoredEvent, a toolbus.ToolAnswer) {
			if a.CallID == callID && a.Who == principal {
				answered[mark{a.Attempt, a.Seq}] = true
			}
		},
		RunEnded: func(events.StoredEvent, toolbus.RunEnded) { ended = true },
	}
	for _, ev := range evs {
		v.Visit(ev)
	}
	switch {
	case ended:
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("run %s already ended", run)}
	case open == nil:
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("call %s of run %s asked no question", callID, run)}
	case answered[mark{open.Attempt, open.Seq}]:
		return toolbus.ToolQuestion{}, &RefusedError{Msg: fmt.Sprintf("the question of call %s of run %s was already answered", callID, run)}
	}
	return *open, nil
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
