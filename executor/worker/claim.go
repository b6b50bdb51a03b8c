package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/events/store"
)

// Claiming a call: a call runs at most once while the executor that claimed it holds
// its lease; a claim of a dead executor is taken over, a yielded or abandoned attempt is
// marked on its claim.

// claimPoll is how often a delivery of a call that another live executor claimed checks
// whether that executor finished or died.
const claimPoll = time.Second

// takeoverHook, when set (tests), runs right after a take-over of a claim, before the
// look-up of a result stored meanwhile: where a late result of the earlier attempt
// races the new one.
var takeoverHook func()

// runFullDelay is the least delay before a call of a run at its cap is taken again
// (up to twice this, so the retries of a large step spread out).
const runFullDelay = 250 * time.Millisecond

// owned is the claim of a call this worker owns: the attempt it runs and the claim's
// revision, its fencing token (abandoning the attempt is a compare-and-set on it).
type owned struct {
	claim store.Claim
	rev   uint64
}

// claim takes the execution of a call before its tool runs, so a call runs at most once
// while the executor that claimed it holds its lease. It returns true when this worker
// owns the call and must produce its result, with the claim (its attempt is 1, or one
// more than the claim it took over); false when the call is done elsewhere (its result
// is stored) and the message is only acknowledged. When the claim belongs to a live
// executor it waits, sending heartbeats, until that executor stores the result, dies
// (its instance record, name and boot id, expired) or abandons the attempt; then the
// claim is taken over with a compare-and-set, and the call runs again with the same
// idempotency key.
func (w *Worker) claim(ctx context.Context, msg jetstream.Msg, queue string, req toolbus.ToolRequested, log func() *slog.Logger) (bool, owned, error) {
	mine := store.Claim{Team: w.cfg.Team, Instance: w.cfg.Instance, Boot: w.boot, Attempt: 1, At: time.Now().UTC()}
	var (
		cur     store.Claim
		rev     uint64
		claimed bool
	)
	err := w.retry(ctx, msg, log, "claim the call", func() (err error) {
		cur, rev, err = w.bus.Store().ClaimCall(ctx, queue, req.RunID, req.Step, req.Call.CallID, mine)
		claimed = err == nil
		if errors.Is(err, store.ErrClaimed) {
			return nil
		}
		return err
	})
	if err != nil {
		return false, owned{}, err
	}
	if claimed {
		return true, owned{mine, rev}, nil
	}
	stopBeat := consume.Heartbeat(msg, w.beatEvery())
	defer stopBeat()
	for {
		stored, err := w.resultStored(ctx, queue, req)
		stored = stored || cur.Done
		if err != nil {
			return false, owned{}, err
		}
		if stored {
			log().Info("result already stored, call not run again", "claimed_by", cur.Instance)
			return false, owned{}, nil
		}
		alive := false
		// Our own earlier claim (same name and boot): that handling is over (hold
		// keeps two handlings of a call in one process apart).
		if !cur.Abandoned && (cur.Instance != w.cfg.Instance || cur.Boot != w.boot) {
			if alive, err = w.bus.Store().InstanceAlive(ctx, cur.Team, cur.Instance, cur.Boot); err != nil {
				return false, owned{}, err
			}
		}
		if !alive {
			mine.Attempt, mine.Retries = cur.Attempt+1, cur.Retries
			nrev, err := w.bus.Store().TakeOverClaim(ctx, queue, req.RunID, req.Step, req.Call.CallID, mine, rev)
			if err == nil {
				if takeoverHook != nil {
					takeoverHook()
				}
				// A result stored between the check above and the take-over was
				// published by an earlier attempt (one that held its lease then, or a
				// late publication of one cut off): it is the call's. The claim says so,
				// so that the injector joins that result instead of waiting for this
				// attempt's.
				if stored, err := w.resultStored(ctx, queue, req); err != nil || stored {
					if err == nil {
						err = w.yield(ctx, msg, queue, req, owned{mine, nrev}, log)
					}
					return false, owned{}, err
				}
				if cur.Retry {
					log().Info("retrying the call by the tool's policy, with the same idempotency key", "attempt", mine.Attempt)
					return true, owned{mine, nrev}, nil
				}
				why := "the executor that claimed this call is gone"
				if cur.Abandoned {
					why = "the executor that claimed this call lost its lease and handed it back"
				}
				log().Warn(why+": running it again with the same idempotency key",
					"claimed_by", cur.Instance, "claimed_boot", cur.Boot, "attempt", mine.Attempt)
				return true, owned{mine, nrev}, nil
			}
			if !errors.Is(err, events.ErrConflict) {
				return false, owned{}, err
			}
		}
		select {
		case <-ctx.Done():
			return false, owned{}, ctx.Err()
		case <-time.After(claimPoll):
		}
		mine.Attempt, mine.Retries = 1, nil
		if cur, rev, err = w.bus.Store().ClaimCall(ctx, queue, req.RunID, req.Step, req.Call.CallID, mine); err == nil {
			return true, owned{mine, rev}, nil // the claim went away (expired with the retention): ours now
		} else if !errors.Is(err, store.ErrClaimed) {
			return false, owned{}, err
		}
	}
}

// yield marks this worker's attempt, which took the claim over, as yielded to the
// result an earlier attempt stored meanwhile: the attempt does not run.
func (w *Worker) yield(ctx context.Context, msg jetstream.Msg, queue string, req toolbus.ToolRequested, o owned, log func() *slog.Logger) error {
	o.claim.Yielded = true
	if err := w.markClaim(ctx, msg, queue, req, o, log, "yield the claim"); err != nil {
		return err
	}
	log().Info("result of an earlier attempt stored after the take-over: this attempt yields to it", "attempt", o.claim.Attempt)
	return nil
}

// abandon marks this worker's attempt at a call abandoned (its lease ran out before a
// result was stored), so that the next delivery runs the call again at once even though
// this executor is alive. A claim already taken over is left alone.
func (w *Worker) abandon(ctx context.Context, msg jetstream.Msg, queue string, req toolbus.ToolRequested, o owned, log func() *slog.Logger) error {
	o.claim.Abandoned = true
	if err := w.markClaim(ctx, msg, queue, req, o, log, "abandon the claim"); err != nil {
		return err
	}
	log().Warn("lease lost mid-call: attempt abandoned, the call is handed back", "attempt", o.claim.Attempt)
	return nil
}

// markClaim writes o.claim over the revision this worker owns. A conflict means the
// claim changed since (taken over) or an earlier try of this write landed: either way
// there is nothing left to mark.
func (w *Worker) markClaim(ctx context.Context, msg jetstream.Msg, queue string, req toolbus.ToolRequested, o owned, log func() *slog.Logger, what string) error {
	return w.retry(ctx, msg, log, what, func() error {
		_, err := w.bus.Store().TakeOverClaim(ctx, queue, req.RunID, req.Step, req.Call.CallID, o.claim, o.rev)
		if errors.Is(err, events.ErrConflict) {
			return nil
		}
		return err
	})
}
