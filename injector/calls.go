package injector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// The calls of a step, from its model.responded event.
//
// Every result and waiting notice is checked against the calls of its step's recorded
// assistant message (checkCall). Instead of reading that message once per step, the
// injector follows the model.responded events with a core NATS subscription and keeps
// the calls they carry (callCache.heard). A step whose event it did not hear (published
// before it subscribed, lost in a reconnection or a slow-consumer drop, forgotten to
// bound the cache) is read, as it always may be: nothing depends on the subscription.
//
// Why the calls heard are the recorded ones. A core subscriber hears every publish the
// server lets through on the subject, including one the stream then refuses or
// deduplicates (the duplicate window is keyed by Nats-Msg-Id across the whole stream, so
// any publisher could make the stream drop a genuine event). So the stream's acceptance
// proves nothing here; the publish permission does. Only the planner role (and the
// admin) may publish toolbus.*.model.responded (deploy/nats/permissions.conf: no
// executor, team executor, injector or client may), and the planner publishes a step's
// model.responded only with the answer the history bucket recorded: after its write of
// the assistant message, which the first write wins (a planner that lost the race, or
// that redoes a step, publishes the recorded one it got back: planner.answer). The
// event's body must name the run of its subject and its id must be the step's event id
// (respondedOf), so a planner's event for one step is never taken for another's. A
// deployment without authorization has no such boundary, but there any client may
// also write the history bucket itself.

// ErrNoCallSubscription: the credentials may not subscribe to model.responded (a
// deployment whose permissions predate it); the injector reads each step's assistant
// message instead.
var ErrNoCallSubscription = errors.New("injector: no permission to subscribe to model.responded")

// followCalls subscribes to the model.responded events of every run and caches the
// calls each one carries. The returned function removes the subscription. An error
// (ErrNoCallSubscription when the server refused it) leaves the injector reading.
func (in *Injector) followCalls(ctx context.Context) (func(), error) {
	nc := in.bus.Conn()
	sub, err := nc.Subscribe(events.SubjectModelResponded("*"), func(m *nats.Msg) {
		if mr, ok := respondedOf(m); ok && len(mr.Message.ToolCalls) > 0 {
			in.calls.heard(stepID(mr.RunID, mr.Step), mr.Message.ToolCalls)
		}
	})
	if err != nil {
		return func() {}, fmt.Errorf("injector: subscribe to model.responded: %w", err)
	}
	stop := func() { _ = sub.Unsubscribe() } // the connection may be closing
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := nc.FlushWithContext(ctx); err != nil {
		stop()
		return func() {}, fmt.Errorf("injector: flush the model.responded subscription: %w", err)
	}
	// A refused subscription is reported asynchronously, before the flush's answer.
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), ".model.responded") {
		stop()
		return func() {}, fmt.Errorf("%w: %w", ErrNoCallSubscription, err)
	}
	return stop, nil
}

// respondedOf decodes a model.responded message heard on the subscription. Only an
// event whose body agrees with its subject (events.CheckSubject: the run) and whose id
// is its step's model.responded id counts: anything else is ignored, never cached.
func respondedOf(m *nats.Msg) (toolbus.ModelResponded, bool) {
	var mr toolbus.ModelResponded
	ev, err := events.DecodeEvent(m)
	if err != nil || ev.Type != events.TypeModelResponded || ev.Bind(&mr) != nil {
		return mr, false
	}
	if events.CheckSubject(m.Subject, ev.Meta, &mr) != nil || !toolbus.ValidRunID(mr.RunID) || mr.Step < 0 ||
		ev.ID != events.IDModelResponded(mr.RunID, mr.Step) || len(mr.Message.ToolCalls) > store.MaxStepCalls {
		return mr, false
	}
	return mr, true
}
