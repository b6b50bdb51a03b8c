package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/teamqueue"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// Liveness of a running call. Two signals say an executor is alive: its instance record,
// renewed every fifth of the instance TTL (its lease, lease.go: one KV write and one
// read per period per process, whatever it runs), and an InProgress acknowledgement of
// each call it runs, every third of the queue's AckWait (one message per period per
// call, with no reply). When the executor dies both stop: the server redelivers the call
// one AckWait after the last InProgress, and another executor takes the claim over once
// the instance record expired, one TTL after the last renewal. The queues' AckWait is
// workerconfig.QueueAckWait, no longer than the TTL, so the hand-over comes about one TTL
// (default 5 s) after the death, plus at most one claimPoll, whatever the tool's
// HeartbeatTimeout: a tool that is alive but stuck is timed out by that instead.

// wantAckWait is the AckWait of the queues this worker creates.
func (w *Worker) wantAckWait() time.Duration {
	return workerconfig.QueueAckWait(w.cfg.AckWait, w.bus.Store().InstanceTTL())
}

// beatEvery is the period of the InProgress heartbeats of a call this worker holds: a
// third of the shortest AckWait of its queues.
func (w *Worker) beatEvery() time.Duration { return time.Duration(w.queueWait.Load()) / 3 }

// noteAckWait records the AckWait of a bound queue: a shorter one than any so far sets
// the heartbeats' period; a longer one than this worker would create delays the
// hand-over of the calls of a dead executor, which is logged.
func (w *Worker) noteAckWait(tool string, ackWait time.Duration) {
	for {
		cur := w.queueWait.Load()
		if ackWait <= 0 || int64(ackWait) >= cur || w.queueWait.CompareAndSwap(cur, int64(ackWait)) {
			break
		}
	}
	if want := w.wantAckWait(); ackWait > want {
		w.log.Warn("the queue waits longer than the lease before it redelivers the call of a dead executor: `toolbus init` updates it",
			"tool", tool, "queue_ack_wait", ackWait, "want", want)
	}
}

// queue binds the durable consumer of one tool's queue, creating it if it is missing.
func (w *Worker) queue(ctx context.Context, tool string) (jetstream.Consumer, error) {
	name := events.ToolConsumer(tool)
	if w.bus.TeamAccount() {
		// Bound without asking its info (events/teamqueue): a pull that takes nothing
		// says whether the queue is there.
		if err := teamqueue.Probe(ctx, w.bus, tool); errors.Is(err, teamqueue.ErrUnreachable) {
			return nil, &MissingQueuesError{Tools: []string{tool}, Err: err}
		} else if err != nil {
			return nil, fmt.Errorf("executor: queue %s: %w", name, err)
		}
		return teamqueue.Open(w.bus, tool, w.wantAckWait()), nil
	}
	cons, err := w.bus.QueueStream().Consumer(ctx, name)
	if err == nil {
		w.noteAckWait(tool, cons.CachedInfo().Config.AckWait)
		return cons, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("executor: queue %s: %w", name, err)
	}
	cons, err = provision.Consumer(ctx, w.bus, provision.ToolConsumerConfig(tool, w.wantAckWait(), w.cfg.MaxAckPending))
	if err != nil {
		return nil, &MissingQueuesError{Tools: []string{tool}, Err: err}
	}
	w.noteAckWait(tool, cons.CachedInfo().Config.AckWait)
	return cons, nil
}
