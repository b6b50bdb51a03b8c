package reads

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	notCalled := questionState(events.QuestionState{Error: fmt.Sprintf("call %s of step %d of run %s is no call of tool %s", q.CallID, q.Step, q.RunID, tool)})
	// One read before the run's every event: the team names any run, and a run that
	// never requested its tool holds no call of it (a flood of such reads would make the
	// core read other tenants' runs whole, with its authority, at the team's pace).
	stream, err := s.stream(ctx, s.bus.Config().Stream)
	if err == nil {
		_, err = events.GetLastMsg(ctx, stream, events.SubjectToolRequested(q.RunID, tool))
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return notCalled
	}
	var evs []runlog.StoredEvent
	if err == nil {
		evs, err = runlog.Events(ctx, s.bus, q.RunID)
	}
	if err != nil {
		return questionState(events.QuestionState{Error: "the run cannot be read: " + err.Error()})
	}
	// The one rule of questions: only the call's own tool's questions count, so another
	// team's question naming this call (on its own tool's subject) neither passes for
	// this one nor keeps it unasked.
	qs := decide.QuestionsOf(evs)
	if called, ok := qs.CallTool(q.Step, q.CallID); !ok || called != tool {
		return notCalled
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
