package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/executor"
)

// askRecheck is how often a call that waits for an answer reads the run's answers from
// the stream again, in case the core subscription missed one (a reconnection).
const askRecheck = 15 * time.Second

// asker returns the Asker of one running call. Questions are durable by re-running: a
// question is one per step, call and seq (the tool's questions numbered from 1 in the
// order it asks them), whichever attempt asks it. Before asking, the asker reads the
// run's events (decide.Questions, the rule `toolbus answer` and the console read them
// by): a question the run's principal already answered returns that answer at once; a
// question already asked and not answered is not published again, the call waits for
// its answer; else it is published as a tool.question event of this attempt. So a tool
// whose executor died while it waited (or which its retry policy runs again) asks again
// when it runs again, and gets the answer given in between, or waits for the same open
// question. The answer is the first tool.answer of the run with the same step, call and
// seq by the run's principal (nobody else answers its questions), heard on a core NATS
// subscription to the run's answers made before the stream is read, and read from the
// stream again every askRecheck. The wait ends with the call's context.
func (w *Worker) asker(req toolbus.ToolRequested, attempt int, lv leaseView) executor.Asker {
	var (
		mu  sync.Mutex
		seq int
	)
	return func(ctx context.Context, q executor.Question) (executor.Answer, error) {
		mu.Lock()
		seq++
		n := seq
		mu.Unlock()
		if q.Seq > 0 { // the executor numbers its questions (AskAll asks several at once)
			n = q.Seq
		}
		if !lv.valid() {
			return executor.Answer{}, fmt.Errorf("executor: question not asked: %w", errLeaseLost)
		}
		k := decide.QuestionKey{Step: req.Step, CallID: req.Call.CallID, Seq: n}
		log := w.log.With("run_id", req.RunID, "call_id", req.Call.CallID, "tool", req.Call.Tool, "seq", n, "attempt", attempt)
		if w.bus.TeamAccount() {
			return w.askThroughCore(ctx, req, attempt, k, q, log)
		}
		// Listen before reading: an answer stored after the read is heard.
		sub, err := w.bus.Conn().SubscribeSync(events.FilterToolAnswers(req.RunID))
		if err != nil {
			return executor.Answer{}, fmt.Errorf("executor: listen for the answer: %w", err)
		}
		defer sub.Unsubscribe() //nolint:errcheck // best effort: the subscription ends with the call
		qs, err := w.questions(ctx, req.RunID)
		if err != nil {
			return executor.Answer{}, err
		}
		if a, ok := qs.Answer(k); ok {
			log.Info("call asks a question answered before (it ran again): the answer is given at once", "who", a.Who)
			return answerOf(a), nil
		}
		if prev, asked := qs.Asked(k); asked {
			log.Info("call asks a question asked before (it ran again): waiting for its answer, not asked again", "asked_by_attempt", prev.Attempt)
		} else {
			tq := questionEvent(req, attempt, n, q)
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = w.bus.PublishEvent(pctx, events.ToolQuestionEvent(w.source, tq))
			cancel()
			if err != nil {
				return executor.Answer{}, fmt.Errorf("executor: publish the question: %w", err)
			}
			log.Info("call asks its caller")
		}
		return w.awaitAnswer(ctx, sub, qs, req.RunID, k, log)
	}
}

// questions reads the questions of run from the stream.
func (w *Worker) questions(ctx context.Context, run string) (*decide.Questions, error) {
	evs, err := runlog.Events(ctx, w.bus, run)
	if err != nil {
		return nil, fmt.Errorf("executor: read the run's questions: %w", err)
	}
	return decide.QuestionsOf(evs), nil
}

// awaitAnswer waits for the answer to question k: on sub, or in the stream, read again
// every askRecheck.
func (w *Worker) awaitAnswer(ctx context.Context, sub *nats.Subscription, qs *decide.Questions, run string, k decide.QuestionKey, log *slog.Logger) (executor.Answer, error) {
	for {
		wctx, cancel := context.WithTimeout(ctx, askRecheck)
		msg, err := sub.NextMsgWithContext(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return executor.Answer{}, fmt.Errorf("executor: no answer to question %d before the call ended: %w", k.Seq, ctx.Err())
		case errors.Is(err, context.DeadlineExceeded):
			again, err := w.questions(ctx, run)
			if err != nil {
				continue // read again at the next recheck; the subscription still listens
			}
			if a, ok := again.Answer(k); ok {
				return answerOf(a), nil
			}
			continue
		case err != nil:
			return executor.Answer{}, fmt.Errorf("executor: listen for the answer: %w", err)
		}
		var a toolbus.ToolAnswer
		if _, typ, err := events.CheckMsg(msg); err != nil || typ != events.TypeToolAnswer {
			continue // not an answer whose subject and data agree
		}
		if _, err := events.Decode(msg, &a); err != nil || decide.AnswerKey(a) != k {
			continue // another question's
		}
		if !qs.Counts(a) {
			log.Warn("answer ignored: not by the run's caller", "who", a.Who, "principal", qs.Principal())
			continue
		}
		return answerOf(a), nil
	}
}

// answerOf is the tool's view of an answer.
func answerOf(a toolbus.ToolAnswer) executor.Answer {
	return executor.Answer{Action: a.Action, Content: a.Content, Reason: a.Reason, Who: a.Who}
}

// questionEvent is the tool.question of q, the call's question seq of this attempt.
func questionEvent(req toolbus.ToolRequested, attempt, seq int, q executor.Question) toolbus.ToolQuestion {
	return toolbus.ToolQuestion{RunID: req.RunID, Step: req.Step, CallID: req.Call.CallID, Tool: req.Call.Tool,
		Attempt: attempt, Seq: seq, Message: q.Message, Schema: q.Schema, Key: q.Key,
		Method: q.Method, Params: q.Params, Batch: q.Batch, BatchSize: q.BatchSize}
}
