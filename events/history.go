package events

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/toolbus/toolbus"
)

// History returns the messages a model reads before planning step: the run's input
// messages, then for each earlier step its assistant message whole followed by one tool
// message per call in call order. Every earlier step must be complete.
func (b *Bus) History(ctx context.Context, run string, step int) ([]toolbus.Message, error) {
	rs, err := b.RunStarted(ctx, run)
	if err != nil {
		return nil, err
	}
	msgs := append([]toolbus.Message(nil), rs.Messages...)
	for s := 0; s < step; s++ {
		more, err := b.StepMessages(ctx, run, s)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, more...)
	}
	return msgs, nil
}

// StepMessages returns the messages one complete step adds to the history: the assistant
// message and its tool messages in call order.
func (b *Bus) StepMessages(ctx context.Context, run string, step int) ([]toolbus.Message, error) {
	mr, err := b.Assistant(ctx, run, step)
	if err != nil {
		return nil, err
	}
	out := []toolbus.Message{mr.Message}
	if len(mr.Message.ToolCalls) == 0 {
		return out, nil
	}
	rec, _, err := b.Step(ctx, run, step)
	if err != nil {
		return nil, err
	}
	return append(out, rec.ToolMessages()...), nil
}

// ToolMessages returns the tool messages of a complete step in call order.
func (r *StepRecord) ToolMessages() []toolbus.Message {
	out := make([]toolbus.Message, 0, len(r.Results))
	for _, res := range r.Results {
		if res != nil {
			out = append(out, toolbus.ToolMessage(*res))
		}
	}
	return out
}

// UsageSoFar sums the model usage recorded for steps 0..step-1 of a run.
func (b *Bus) UsageSoFar(ctx context.Context, run string, step int) (toolbus.Usage, error) {
	var u toolbus.Usage
	for s := 0; s < step; s++ {
		mr, err := b.Assistant(ctx, run, s)
		if err != nil {
			return u, fmt.Errorf("events: usage of %s step %d: %w", run, s, err)
		}
		u = u.Add(mr.Usage)
	}
	return u, nil
}

// LastModelRequest returns the step of the run's latest model.requested event.
func (b *Bus) LastModelRequest(ctx context.Context, run string) (int, error) {
	raw, err := b.Stream.GetLastMsgForSubject(ctx, SubjectModelRequested(run))
	if err != nil {
		return 0, fmt.Errorf("events: last model request of %s: %w", run, err)
	}
	var mr toolbus.ModelRequested
	if _, err := Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, &mr); err != nil {
		return 0, err
	}
	return mr.Step, nil
}
