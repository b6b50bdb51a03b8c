package runlog

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// CancelRequest returns the run.cancel event of a run, if one was published: the first
// one on its subjects (whoever sent it) whose body agrees with its subject; a message
// there naming another run or another actor (a forgery consumers terminate) cancels
// nothing.
func CancelRequest(ctx context.Context, b *events.Bus, run string) (toolbus.Cancel, bool, error) {
	subject := events.SubjectRunCancelAny(run)
	for seq := uint64(1); ; {
		raw, err := events.GetMsg(ctx, b.EventStream(), seq, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return toolbus.Cancel{}, false, nil
		}
		if err != nil {
			return toolbus.Cancel{}, false, fmt.Errorf("events: run.cancel of %s: %w", run, err)
		}
		var c toolbus.Cancel
		m, err := events.Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, &c)
		if err == nil && m.Type == events.TypeRunCancel && events.CheckSubject(raw.Subject, m, &c) == nil {
			return c, true, nil
		}
		seq = raw.Sequence + 1
	}
}

// History returns the messages a model reads before planning step: the run's input
// messages, then for each earlier step its assistant message whole followed by one tool
// message per call in call order. Every earlier step must be complete.
func History(ctx context.Context, b *events.Bus, run string, step int) ([]toolbus.Message, error) {
	rs, err := b.RunStarted(ctx, run)
	if err != nil {
		return nil, err
	}
	msgs := append([]toolbus.Message(nil), rs.Messages...)
	for s := 0; s < step; s++ {
		more, err := b.Store().StepMessages(ctx, run, s)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, more...)
	}
	return msgs, nil
}

// LastModelRequest returns the step of the run's latest model.requested event.
func LastModelRequest(ctx context.Context, b *events.Bus, run string) (int, error) {
	raw, err := events.GetLastMsg(ctx, b.EventStream(), events.SubjectModelRequested(run))
	if err != nil {
		return 0, fmt.Errorf("events: last model request of %s: %w", run, err)
	}
	var mr toolbus.ModelRequested
	if _, err := events.Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, &mr); err != nil {
		return 0, err
	}
	return mr.Step, nil
}
