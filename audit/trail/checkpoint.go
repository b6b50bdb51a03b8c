package trail

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// How long and how often Collect waits for a checkpoint to cover a run's events.
const (
	coverWait = 5 * time.Second
	coverPoll = 200 * time.Millisecond
)

// prove attaches to the bundle the latest checkpoint and its events' inclusion proofs
// (audit/checkpoint). A stream that no longer hashes to its checkpoint is an error
// (a run removed whole, a rewritten past): the trail cannot be trusted. No checkpoint
// signed yet leaves the bundle without one, which Verify refuses.
func prove(ctx context.Context, b *events.Bus, out *Bundle) error {
	seqs := make([]uint64, len(out.Events))
	for i, r := range out.Events {
		seqs[i] = r.Seq
	}
	// A run that just ended waits for the checkpoint its end triggers (a few polls of
	// the core's service), not longer: a run still going is covered at the next interval.
	p, err := checkpoint.Prove(ctx, b, seqs)
	// A signed outcome (its publisher's injector signs checkpoints), wherever it is: a
	// tenant's stray write after it need not be covered (Verify ignores it, foreign.go).
	var end uint64
	for _, r := range out.Events {
		h := nats.Header(r.Header)
		if checkpoint.IsRunEnd(h.Get("ce-type")) && h.Get(seal.HeaderMaterial) != "" {
			end = r.Seq
		}
	}
	ended := end != 0
	uncovered := func() bool {
		return errors.Is(err, checkpoint.ErrNone) || err == nil && !slices.ContainsFunc(p.Leaves, func(l checkpoint.Leaf) bool { return l.Seq == end })
	}
	for deadline := time.Now().Add(coverWait); ended && uncovered() && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(coverPoll):
		}
		p, err = checkpoint.Prove(ctx, b, seqs)
	}
	switch {
	case errors.Is(err, checkpoint.ErrNone):
		return nil
	case err != nil:
		return fmt.Errorf("trail: run %s: %w", out.Run, err)
	}
	out.Checkpoint = p
	return nil
}

// included checks that every event (every foreign one the checkpoint covers) is a leaf of the bundle's signed checkpoint; it
// returns the first failure, nil when every event is, and the checkpoint's size.
func included(b Bundle, evs []*event) (int64, error) {
	if b.Checkpoint == nil {
		return 0, &Failure{Index: 0, Seq: evs[0].rec.Seq, ID: evs[0].meta.ID, Check: "checkpoint",
			Reason: "the bundle holds no signed checkpoint (none was signed yet): a run removed whole or a rewritten past would not be detected"}
	}
	c, _, err := b.Checkpoint.Check(b.Keys, b.Stream)
	if err != nil {
		return 0, &Failure{Index: 0, Seq: evs[0].rec.Seq, ID: evs[0].meta.ID, Check: "checkpoint", Reason: err.Error()}
	}
	for i, e := range evs {
		// A foreign event stored after the checkpoint is not judged; one it covers is.
		if e.foreign && !slices.ContainsFunc(b.Checkpoint.Leaves, func(l checkpoint.Leaf) bool { return l.Seq == e.rec.Seq }) {
			continue
		}
		if why := b.Checkpoint.Includes(c, e.rec.Seq, checkpoint.LeafHash(e.rec.Header, e.rec.Data)); why != "" {
			return 0, &Failure{Index: i, Seq: e.rec.Seq, ID: e.meta.ID, Check: "checkpoint", Reason: why}
		}
	}
	return c.Size, nil
}
