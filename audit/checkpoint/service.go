package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// Poll is how often the service looks for new messages once it has read the stream.
const Poll = 250 * time.Millisecond

// Service follows the event stream (batched direct gets, no consumer), keeps the tree
// of its leaves, and signs a checkpoint with the bus's signer whenever a run ended and
// it has read what the stream holds (runs ending together share one), and at every
// Interval the tree grew: one KV write per checkpoint, and one read per Poll or per 256
// messages, none per event. It stores the tree's tiles beside the checkpoints (tiles.go)
// at most once per Interval and when it stops, and starts from them: the leaves whose
// messages expired come from the tiles, the rest from the stream.
type Service struct {
	Bus      *events.Bus
	Interval time.Duration // 0: a minute
	Log      *slog.Logger
	Metrics  Metrics // nil: none

	st     *state
	signed int64  // the size last signed
	note   string // the checkpoint signed last
	due    bool   // a run ended since
	// past is the latest checkpoint stored when the service started: the stored tiles
	// and the stream must still hash to it, else the past was rewritten and the
	// service signs nothing.
	past    *Checkpoint
	refused bool
	kept    int64     // the leaves the stored tiles hold
	keptAt  time.Time // when this process stored tiles (zero: not yet)
}

// Metrics is what the service reports (telemetry.Metrics implements it): the size of
// each checkpoint it signs, and that it signs none any more and why. A core that stopped
// signing must not look healthy: every run's verify fails its checkpoint from then on.
type Metrics interface {
	CheckpointSigned(size int64)
	CheckpointsRefused(reason string)
}

// Run follows the stream until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if s.Log == nil {
		s.Log = slog.Default()
	}
	if s.Interval <= 0 {
		s.Interval = time.Minute
	}
	if !s.start(ctx) {
		return nil
	}
	r := newReader(s.Bus)
	next, lastSign, warned := uint64(1), time.Now(), false
	for {
		last, err := r.from(ctx, next, func(seq uint64, h nats.Header, data []byte) bool {
			s.add(ctx, seq, h, data)
			return false
		})
		next = last + 1
		switch {
		case err != nil && ctx.Err() == nil && !warned:
			s.Log.Warn("checkpoint: reading the event stream failed (retrying)", "error", err)
			warned = true
		case err == nil && s.past != nil && !s.refused && (s.st.tree.Size() < s.past.Size || s.st.short() != ""):
			s.short(ctx, last)
		case err == nil && (s.due || time.Since(lastSign) >= s.Interval):
			s.sign(ctx)
			lastSign = time.Now()
		}
		select {
		case <-ctx.Done():
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			s.keep(kctx)
			cancel()
			return nil
		case <-time.After(Poll):
		}
	}
}

// start loads the latest checkpoint and the stored tiles, retrying until it can read
// them; tiles that do not hash to their checkpoint stop the signing. It returns false
// when ctx ended.
func (s *Service) start(ctx context.Context) bool {
	for warned := false; ; warned = true {
		err := s.restore(ctx)
		switch {
		case err == nil:
			return true
		case errors.Is(err, ErrTiles):
			s.stop(err.Error())
			return true
		case !warned:
			s.Log.Warn("checkpoint: reading the latest checkpoint and tiles failed (retrying)", "error", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(Poll):
		}
	}
}

// restore sets the service's past and its tree from the stored tiles.
func (s *Service) restore(ctx context.Context) error {
	s.st = newState(signedLeaf)
	signed, m, tree, err := stored(ctx, s.Bus.JetStream())
	if err != nil || signed == "" {
		return err
	}
	c, err := body(signed)
	if err != nil {
		return err
	}
	s.past = &c
	if m != nil {
		s.st.tree, s.st.at, s.st.stored = *tree, m.Spans, m.Size
		s.kept = m.Size
	}
	return nil
}

// add takes the stream's message of seq: a stored leaf it must be, or the next leaf.
func (s *Service) add(ctx context.Context, seq uint64, h nats.Header, data []byte) {
	if s.refused {
		return
	}
	n := s.st.tree.Size()
	if why := s.st.add(seq, h, data); why != "" {
		s.refuse(ctx, why)
		return
	}
	if s.past != nil && s.st.tree.Size() > n && s.st.tree.Size() == s.past.Size {
		if root, err := s.st.tree.Root(s.past.Size); err != nil || root != s.past.Root {
			s.refuse(ctx, fmt.Sprintf("the event stream's first %d messages no longer hash to the latest signed checkpoint (root %s, now %s): a message was removed, moved or rewritten",
				s.past.Size, s.past.Root, root))
		}
	}
	if IsRunEnd(h.Get("ce-type")) {
		s.due = true
	}
}

// short refuses when the stream, read to its end (last: the last sequence read), holds
// fewer messages than the latest checkpoint covers, or lacks stored leaves at its end:
// its past was cut. A read mirror still behind the stream is not (the mirror keeps the
// stream's sequences).
func (s *Service) short(ctx context.Context, last uint64) {
	es := s.Bus.EventStream()
	if es == nil {
		return
	}
	info, err := es.Info(ctx)
	if err != nil || info.State.LastSeq > last {
		return
	}
	if why := s.st.short(); why != "" {
		s.refuse(ctx, why)
		return
	}
	s.refuse(ctx, fmt.Sprintf("the event stream holds %d messages after the stored tiles' %d, fewer than the %d the latest signed checkpoint covers: messages were removed",
		s.st.tree.Size()-s.st.stored, s.st.stored, s.past.Size))
}

// refuse stops the signing for good, loudly: the stored tiles or the stream no longer
// hold what the latest checkpoint signed. Signing on would bless the rewritten past; the
// operator must find out what happened (an auditor's witness holds the older
// checkpoints), not learn of it from an auditor. The stream denies deletes, so a first
// sequence after the stored tiles' last leaf is its retention (TOOLBUS_RETENTION)
// having dropped events before their leaves were stored: the reason says so, and what
// is lost.
func (s *Service) refuse(ctx context.Context, reason string) {
	if es := s.Bus.EventStream(); es != nil {
		if info, err := es.Info(ctx); err == nil && info.State.FirstSeq > s.st.next() {
			reason += expired(info.State.FirstSeq, s.st)
		}
	}
	s.stop(reason)
}

// stop stops the signing for good and says why.
func (s *Service) stop(reason string) {
	s.refused = true
	size := int64(0)
	if s.past != nil {
		size = s.past.Size
	}
	s.Log.Error("checkpoint: signing STOPPED: "+reason+"; no checkpoint is signed from now on and every run's verify fails its checkpoint check (keep the stream and bucket "+Bucket+" for the audit)",
		"size", size)
	if s.Metrics != nil {
		s.Metrics.CheckpointsRefused(reason)
	}
}

// expired is what a refusal adds when the stream's first message (first) comes after
// the stored tiles' last leaf: what is lost, and the way out.
func expired(first uint64, st *state) string {
	if st.stored == 0 {
		return fmt.Sprintf(" (or expired: the stream's first message is now sequence %d, its retention dropped the ones before, and no tiles of the tree are stored (its checkpoints were signed before tiles were: an upgrade), so the tree cannot be rebuilt. Lost: the inclusion proofs of every run not exported before, and the proof that later checkpoints extend the signed ones; bundles exported before still verify offline. To sign a new tree from sequence %d on, an administrator deletes key %s and %s of bucket %s, keeping a copy of the checkpoint for the witnesses)",
			first, first, keyLatest, keyTiles, Bucket)
	}
	return fmt.Sprintf(" (or expired: the stream's first message is now sequence %d, and the stored tiles end at sequence %d: the messages between expired before their leaves were stored)", first, st.next()-1)
}

// sign signs and stores the tree's head when it grew, and the tiles at most once per
// Interval.
func (s *Service) sign(ctx context.Context) {
	n := s.st.tree.Size()
	signer := s.Bus.Signer()
	if n == s.signed || signer == nil || s.refused || s.past != nil && n < s.past.Size {
		return
	}
	root, err := s.st.tree.Root(n)
	var note string
	if err == nil {
		if note, err = (Checkpoint{Origin: Origin(s.Bus.Config().Stream), Size: n, Root: root}).Sign(signer); err == nil {
			err = Put(ctx, s.Bus.JetStream(), note)
		}
	}
	if err != nil {
		s.Log.Warn("checkpoint: not signed", "size", n, "error", err)
		return
	}
	s.signed, s.note, s.due = n, note, false
	if s.Metrics != nil {
		s.Metrics.CheckpointSigned(n)
	}
	if s.keptAt.IsZero() || time.Since(s.keptAt) >= s.Interval {
		s.keep(ctx)
	}
}

// keep stores the tiles of the leaves signed since the last batch.
func (s *Service) keep(ctx context.Context) {
	if s.refused || s.signed <= s.kept {
		return
	}
	kv, err := s.Bus.JetStream().KeyValue(ctx, Bucket)
	if err == nil {
		_, err = saveTiles(ctx, kv, &s.st.tree, s.kept, s.signed, s.note, s.st.at)
	}
	if err != nil {
		s.Log.Warn("checkpoint: tiles not stored (the next batch retries)", "size", s.signed, "error", err)
		return
	}
	s.kept, s.keptAt = s.signed, time.Now()
}

// runEnds are the types of a run's outcomes.
var runEnds = func() map[string]bool {
	out := map[string]bool{}
	for _, st := range []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled} {
		out[events.TypeRunEnded(st)] = true
	}
	return out
}()

// IsRunEnd reports a run outcome's type (whose storing triggers a checkpoint).
func IsRunEnd(typ string) bool { return runEnds[typ] }
