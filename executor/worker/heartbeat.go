package worker

import (
	"context"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/retry"
)

// The instance heartbeat: the record that holds this worker's lease, renewed every
// period, and the server-clock deadline its results carry.

// stampLease reads when the server stored the heartbeat at revision rev, sent at start,
// and moves the lease's server-clock deadline (results carry it as LeaseUntil). On a
// failed read the previous, earlier deadline stays: results stored after it are
// checked against their claim by the injector, which costs a read, never correctness.
func (w *Worker) stampLease(ctx context.Context, rev uint64, start time.Time) {
	rtt := time.Since(start)
	stored, err := w.bus.Store().InstanceStoredAt(ctx, w.cfg.Team, w.cfg.Instance, w.boot, rev)
	if err != nil {
		w.log.Debug("heartbeat's stored time not read; results keep the previous fencing deadline", "error", err)
		return
	}
	w.lease.stamp(stored, rtt)
}

// heartbeat records this instance in the instances bucket now and every
// lease.renewEvery, each acknowledged write renewing the lease; the returned stop ends
// the lease and removes the record.
func (w *Worker) heartbeat(ctx context.Context, served []string) (stop func(), err error) {
	start := time.Now()
	in := store.Instance{Team: w.cfg.Team, Name: w.cfg.Instance, Boot: w.boot, Tools: served, Concurrency: w.cfg.Concurrency,
		StartedAt: start.UTC(), HeartbeatAt: start.UTC()}
	var rev uint64
	err = w.writeLater(ctx, "record the instance", func() error {
		pctx, guarded := w.bus.Guard(ctx, "$KV.")
		// The lease counts from the write that passed, not from the first try.
		start = time.Now()
		in.StartedAt, in.HeartbeatAt = start.UTC(), start.UTC()
		var err error
		rev, err = w.bus.Store().PutInstance(pctx, in)
		return guarded(err)
	})
	if err != nil {
		return nil, err
	}
	w.lease.renewed(start)
	w.stampLease(ctx, rev, start)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		every := w.lease.renewEvery()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				in.Tools = w.servedTools()
				// A slow write still renews the lease from its start: it may take up to
				// the lease itself (a busy server), not only one period.
				pctx, cancel := context.WithTimeout(ctx, w.lease.ttl-w.lease.margin)
				start, rev, err := w.renew(pctx, &in, every/2)
				if err != nil {
					cancel()
					w.log.Warn("instance heartbeat failed", "error", err, "lease_deadline", w.lease.Deadline())
					continue
				}
				w.lease.renewed(start)
				w.stampLease(pctx, rev, start)
				cancel()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		w.lease.stop()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := w.bus.Store().DeleteInstance(dctx, w.cfg.Team, w.cfg.Instance, w.boot); err != nil {
			w.log.Warn("instance not removed from the catalog; it expires by itself", "error", err)
		}
	}, nil
}

// renew writes the instance record, and again in place while the core's write service
// refuses it over the team's bytes per second (or could not forward it), for up to
// within (half a period): left to the next period, three such refusals in a row would
// lapse the lease and hand every running call back, to run again. The refused writes
// spend nothing of the team's budget; the one that passes spends it as any write does.
// start is when the write that passed was sent: it, not the acknowledgement, bounds the
// record's expiry from below (the server stores it after it was sent).
func (w *Worker) renew(ctx context.Context, in *store.Instance, within time.Duration) (start time.Time, rev uint64, err error) {
	err = retry.Do(ctx, retry.Policy{For: within, Base: 20 * time.Millisecond, Max: 250 * time.Millisecond, Jitter: true,
		OnError: func(_ int, err error, wait time.Duration) (time.Duration, error) {
			if !events.WritePassesLater(err) {
				return 0, err
			}
			return wait, nil
		}}, func(ctx context.Context) (err error) {
		start = time.Now()
		in.HeartbeatAt = start.UTC()
		rev, err = w.bus.Store().PutInstance(ctx, *in)
		return err
	})
	return start, rev, err
}
