package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
)

// Polling of a question's state by an executor in a team account: from askPollMin,
// doubling up to askPollMax.
const (
	askPollMin = 200 * time.Millisecond
	askPollMax = 2 * time.Second
)

// askThroughCore asks question k in a team account, where the executor may not read the
// run nor hear its answers: the core tells it the question's state
// (events.ToolQuestionSubject of its tool, answered by the read service of every
// injector, by the same rule as asker's). An answered question returns at once; an
// unasked one is published; then the state is asked again until the run's principal
// answers or the call ends.
func (w *Worker) askThroughCore(ctx context.Context, req toolbus.ToolRequested, attempt int, k decide.QuestionKey, q executor.Question, log *slog.Logger) (executor.Answer, error) {
	query := events.QuestionQuery{RunID: req.RunID, Step: k.Step, CallID: k.CallID, Seq: k.Seq}
	st, err := w.questionState(ctx, req.Call.Tool, query)
	if err != nil {
		return executor.Answer{}, err
	}
	if st.Answer != nil {
		log.Info("call asks a question answered before (it ran again): the answer is given at once", "who", st.Answer.Who)
		return answerOf(*st.Answer), nil
	}
	if !st.Asked {
		tq := questionEvent(req, attempt, k.Seq, q)
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = w.bus.PublishEvent(pctx, events.ToolQuestionEvent(w.source, tq))
		cancel()
		if err != nil {
			return executor.Answer{}, fmt.Errorf("executor: publish the question: %w", err)
		}
		log.Info("call asks its caller (through the core: team account)")
	}
	for pause := askPollMin; ; pause = min(2*pause, askPollMax) {
		select {
		case <-ctx.Done():
			return executor.Answer{}, fmt.Errorf("executor: no answer to question %d before the call ended: %w", k.Seq, ctx.Err())
		case <-time.After(pause):
		}
		st, err := w.questionState(ctx, req.Call.Tool, query)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			log.Warn("question state not read: asking again", "err", err)
			continue
		}
		if st.Answer != nil {
			return answerOf(*st.Answer), nil
		}
	}
}

// questionState asks the core the state of a question of a call of tool.
func (w *Worker) questionState(ctx context.Context, tool string, q events.QuestionQuery) (events.QuestionState, error) {
	data, err := json.Marshal(q)
	if err != nil {
		return events.QuestionState{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := w.bus.Conn().RequestWithContext(rctx, events.ToolQuestionSubject(tool), data)
	if err != nil {
		return events.QuestionState{}, questionStateRefusal(tool, err)
	}
	var st events.QuestionState
	if err := json.Unmarshal(m.Data, &st); err != nil {
		return events.QuestionState{}, fmt.Errorf("executor: the question's state from the core: %w", err)
	}
	if st.Error != "" {
		return events.QuestionState{}, fmt.Errorf("%w: the core: %s", executor.ErrCannotAsk, st.Error)
	}
	return st, nil
}

// questionStateRefusal says why the core told no question's state, and what to do. The
// subject reaches the core's read service through the team's import; the server answers
// no responders both when nothing in the core serves it and when this account has no
// such import, so the refusal names both. Anything else (a timeout): the service is there
// but did not answer in time.
func questionStateRefusal(tool string, err error) error {
	subject := events.ToolQuestionSubject(tool)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("executor: nothing answers %s, where the core tells the state of this team's questions: "+
			"no injector of the core serves the read service (run `toolbus injector` with TOOLBUS_READ_SERVICE=true, the default), "+
			"or this team's account does not import the subject (tool %s revoked, or the account issued before questions: an administrator runs `toolbus admin push`): %w",
			subject, tool, err)
	}
	return fmt.Errorf("executor: the core's read service did not answer %s in time (its injectors overloaded, or cut off from this server): %w", subject, err)
}
