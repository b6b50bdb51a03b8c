package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
)

// PutAssistant records the assistant message of a step. The first write wins: if the
// step already has one (a redelivered model.requested), the stored one is returned with
// created false, so a retried step never changes what the model said.
func (s *Store) PutAssistant(ctx context.Context, mr toolbus.ModelResponded) (toolbus.ModelResponded, bool, error) {
	key := stepKey(mr.RunID, mr.Step, "a")
	if _, err := s.history.Create(ctx, key, mustJSON(mr)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return mr, false, fmt.Errorf("store: history %s: %w", key, err)
		}
		prev, err := s.Assistant(ctx, mr.RunID, mr.Step)
		return prev, false, err
	}
	return mr, true, nil
}

// Assistant returns the recorded assistant message of a step.
func (s *Store) Assistant(ctx context.Context, run string, step int) (toolbus.ModelResponded, error) {
	var mr toolbus.ModelResponded
	err := s.getJSON(ctx, s.history, stepKey(run, step, "a"), &mr)
	return mr, err
}

// StepMessages returns the messages one complete step adds to the history: the assistant
// message and its tool messages in call order.
func (s *Store) StepMessages(ctx context.Context, run string, step int) ([]toolbus.Message, error) {
	mr, err := s.Assistant(ctx, run, step)
	if err != nil {
		return nil, err
	}
	out := []toolbus.Message{mr.Message}
	if len(mr.Message.ToolCalls) == 0 {
		return out, nil
	}
	rec, _, err := s.Step(ctx, run, step)
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
func (s *Store) UsageSoFar(ctx context.Context, run string, step int) (toolbus.Usage, error) {
	var u toolbus.Usage
	for i := 0; i < step; i++ {
		mr, err := s.Assistant(ctx, run, i)
		if err != nil {
			return u, fmt.Errorf("store: usage of %s step %d: %w", run, i, err)
		}
		u = u.Add(mr.Usage)
	}
	return u, nil
}
