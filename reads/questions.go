package reads

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// question answers an executor in a team account the state of a question of a call of
// tool (the subject's tool token): whether it was asked and the answer of the run's
// principal. The team may not read the run, whose answers name no tool; the service
// reads it and answers only of a call the run requested of that tool, by the rule every
// reader of questions shares (decide.Questions).
func (s *Service) question(ctx context.Context, tool string, m *nats.Msg) *nats.Msg {
	var q events.QuestionQuery
	if err := json.Unmarshal(m.Data, &q); err != nil || !toolbus.ValidRunID(q.RunID) {
		return questionState(events.QuestionState{Error: fmt.Sprintf("want a question query {run_id, step, call_id, seq} (%v)", err)})
	}
	evs, err := runlog.Events(ctx, s.bus, q.RunID)
	if err != nil {
		return questionState(events.QuestionState{Error: "the run cannot be read: " + err.Error()})
	}
	// The one rule of questions: only the call's own tool's questions count, so another
	// team's question naming this call (on its own tool's subject) neither passes for
	// this one nor keeps it unasked.
	qs := decide.QuestionsOf(evs)
	if called, ok := qs.CallTool(q.Step, q.CallID); !ok || called != tool {
		return questionState(events.QuestionState{Error: fmt.Sprintf("call %s of step %d of run %s is no call of tool %s", q.CallID, q.Step, q.RunID, tool)})
	}
	k := decide.QuestionKey{Step: q.Step, CallID: q.CallID, Seq: q.Seq}
	st := events.QuestionState{}
	_, st.Asked = qs.Asked(k)
	if a, ok := qs.Answer(k); ok {
		st.Answer = &a
	}
	return questionState(st)
}

func questionState(st events.QuestionState) *nats.Msg {
	data, _ := json.Marshal(st)
	return &nats.Msg{Data: data}
}
