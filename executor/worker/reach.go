package worker

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/teamqueue"
)

// reachEvery is the period of the reach check. A tool revoked from a team (`toolbus
// admin revoke <team> <tool> -push`) takes the imports of its queue away from the
// team's account: from then on the server answers every request on them "no
// responders" (the pulls too, but those are renewed only every minute or two, and a
// parked queue asks nothing for ParkCheck). So every reachEvery the worker asks the
// server about one of its tools' queues in turn (in a team account a pull that takes
// nothing, teamqueue.Probe, which the consumer answers itself; in the core account
// its consumer info: a constant cost whatever the number of tools, next to the lease's
// renewal every second); a queue
// answered "no responders" makes the worker stop offering its tool: the instance record
// drops it at the next renewal, calls of it are refused as unknown, and one line says
// why. A dropped tool is asked about in its turn too: once its queue answers again (the
// tool was granted again) the worker offers it again, with no restart; its consume
// loop, which kept trying, pulls again by itself.
//
// On a cluster a queue also answers "no responders" while its consumer elects a leader
// (a node killed: only the leader subscribes the pulls), for seconds; a tool is dropped
// only when its queue keeps answering so for reachConfirm more probes reachEvery/2 apart.
var reachEvery = 10 * time.Second

// reachConfirm is how many more probes must find the queue gone before a tool is dropped.
const reachConfirm = 4

// watchReach runs the reach check until ctx ends or stop is called.
func (w *Worker) watchReach(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(reachEvery)
		defer t.Stop()
		next := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w.smu.RLock()
			wanted := append(slices.Clone(w.servedList), w.unreachable...)
			w.smu.RUnlock()
			if len(wanted) == 0 {
				continue
			}
			slices.Sort(wanted)
			next %= len(wanted)
			w.checkReach(ctx, wanted[next])
			next++
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// probe asks the server about tool's queue once.
func (w *Worker) probe(ctx context.Context, tool string) error {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if w.bus.TeamAccount() {
		return teamqueue.Probe(ictx, w.bus, tool) // a team may not ask the consumer's info
	}
	_, err := w.bus.QueueStream().Consumer(ictx, events.ToolConsumer(tool))
	return err
}

// queueGone reports whether err of a probe says nothing answers the queue.
func (w *Worker) queueGone(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, teamqueue.ErrUnreachable)
}

// checkReach asks the server about tool's queue and drops (confirmed: reachConfirm) or
// restores the tool.
func (w *Worker) checkReach(ctx context.Context, tool string) {
	err := w.probe(ctx, tool)
	gone := w.queueGone(err)
	if !gone && err != nil {
		return // a slow server, a queue being created: not the credentials
	}
	for i := 0; gone && w.serves(tool) && i < reachConfirm; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(reachEvery / 2):
		}
		gone = w.queueGone(w.probe(ctx, tool))
	}
	w.smu.Lock()
	dropped := slices.Contains(w.unreachable, tool)
	switch {
	case gone && !dropped && w.serving[tool]:
		next := maps.Clone(w.serving) // replaced, never modified (Sync reads it unlocked)
		delete(next, tool)
		w.serving = next
		w.servedList = slices.DeleteFunc(slices.Clone(w.servedList), func(t string) bool { return t == tool })
		w.unreachable = append(slices.Clone(w.unreachable), tool)
		w.smu.Unlock()
		w.log.Error("tool "+tool+": this team's credentials no longer reach its queue (revoked?); not serving it",
			"tool", tool, "error", err, "serving", w.servedTools())
	case !gone && dropped:
		next := maps.Clone(w.serving)
		next[tool] = true
		w.serving = next
		w.servedList = append(slices.Clone(w.servedList), tool)
		w.unreachable = slices.DeleteFunc(slices.Clone(w.unreachable), func(t string) bool { return t == tool })
		w.smu.Unlock()
		w.log.Info("tool "+tool+": its queue is reachable again (granted again?); serving it", "tool", tool)
	default:
		w.smu.Unlock()
	}
}
