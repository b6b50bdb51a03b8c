package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
)

// asker returns the Asker of one running call: each question is published as a
// tool.question event (seq from 1 per attempt) and answered by the first tool.answer
// of the run with the same call, attempt and seq by the run's principal (the caller:
// nobody else answers its questions), heard on a core NATS subscription to the run's
// answers made before the question is published. The wait ends with the call's
// context.
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
		if !lv.valid() {
			return executor.Answer{}, fmt.Errorf("executor: question not asked: %w", errLeaseLost)
		}
		sub, err := w.bus.Conn().SubscribeSync(events.FilterToolAnswers(req.RunID))
		if err != nil {
			return executor.Answer{}, fmt.Errorf("executor: listen for the answer: %w", err)
		}
		defer sub.Unsubscribe() //nolint:errcheck // best effort: the subscription ends with the call
		tq := toolbus.ToolQuestion{RunID: req.RunID, Step: req.Step, CallID: req.Call.CallID, Tool: req.Call.Tool,
			Attempt: attempt, Seq: n, Message: q.Message, Schema: q.Schema}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = w.bus.PublishEvent(pctx, events.ToolQuestionEvent(w.source, tq))
		cancel()
		if err != nil {
			return executor.Answer{}, fmt.Errorf("executor: publish the question: %w", err)
		}
		w.log.Info("call asks its caller", "run_id", req.RunID, "call_id", req.Call.CallID, "tool", req.Call.Tool, "seq", n)
		for {
			msg, err := sub.NextMsgWithContext(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return executor.Answer{}, fmt.Errorf("executor: no answer to question %d before the call ended: %w", n, ctx.Err())
				}
				return executor.Answer{}, fmt.Errorf("executor: listen for the answer: %w", err)
			}
			var a toolbus.ToolAnswer
			if _, typ, err := events.CheckMsg(msg); err != nil || typ != events.TypeToolAnswer {
				continue // not an answer whose subject and data agree
			}
			if _, err := events.Decode(msg, &a); err != nil || a.CallID != tq.CallID || a.Step != tq.Step || a.Attempt != attempt || a.Seq != n {
				continue // another question's
			}
			if a.Who != req.Principal.ID {
				w.log.Warn("answer ignored: not by the run's caller", "run_id", req.RunID, "call_id", req.Call.CallID, "who", a.Who, "principal", req.Principal.ID)
				continue
			}
			return executor.Answer{Action: a.Action, Content: a.Content, Reason: a.Reason, Who: a.Who}, nil
		}
	}
}
