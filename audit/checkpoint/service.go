package checkpoint

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// Poll is how often the service looks for new messages once it has read the stream.
const Poll = 250 * time.Millisecond

// Service follows the event stream from its first message (batched direct gets, no
// consumer), keeps the tree of its leaves, and signs a checkpoint with the bus's signer
// whenever a run ended and it has read what the stream holds (runs ending together
// share one), and at every Interval the tree grew: one KV write per checkpoint, and one
// read per Poll or per 256 messages, none per event.
type Service struct {
	Bus      *events.Bus
	Interval time.Duration // 0: a minute
	Log      *slog.Logger
	Metrics  Metrics // nil: none

	tree   Tree
	signed int64 // the size last signed
	due    bool  // a run ended since
	// past is the latest checkpoint stored when the service started: the stream must
	// still hash to it, else the past was rewritten and the service signs nothing.
	past    *Checkpoint
	refused bool
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
	if signed, err := Latest(ctx, s.Bus.JetStream()); err == nil {
		c, err := body(signed)
		if err != nil {
			return err
		}
		s.past = &c
	}
	r := newReader(s.Bus)
	next, lastSign, warned := uint64(1), time.Now(), false
	for {
		last, err := r.from(ctx, next, func(_ uint64, h nats.Header, data []byte) bool {
			s.add(ctx, h, data)
			return false
		})
		next = last + 1
		switch {
		case err != nil && ctx.Err() == nil && !warned:
			s.Log.Warn("checkpoint: reading the event stream failed (retrying)", "error", err)
			warned = true
		case err == nil && s.past != nil && !s.refused && s.tree.Size() < s.past.Size:
			s.short(ctx, last)
		case err == nil && (s.due || time.Since(lastSign) >= s.Interval):
			s.sign(ctx)
			lastSign = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(Poll):
		}
	}
}

// add appends a message's leaf.
func (s *Service) add(ctx context.Context, h nats.Header, data []byte) {
	s.tree.Append(signedLeaf(h, data))
	if s.past != nil && s.tree.Size() == s.past.Size {
		if root, err := s.tree.Root(s.past.Size); err != nil || root != s.past.Root {
			s.refuse(ctx, fmt.Sprintf("the event stream's first %d messages no longer hash to the latest signed checkpoint (root %s, now %s): a message was removed, moved or rewritten",
				s.past.Size, s.past.Root, root))
		}
	}
	if IsRunEnd(h.Get("ce-type")) {
		s.due = true
	}
}

// short refuses when the stream, read to its end (last: the last sequence read), holds
// fewer messages than the latest checkpoint covers: its past was cut. A read mirror
// still behind the stream is not (the mirror keeps the stream's sequences).
func (s *Service) short(ctx context.Context, last uint64) {
	es := s.Bus.EventStream()
	if es == nil {
		return
	}
	info, err := es.Info(ctx)
	if err != nil || info.State.LastSeq > last {
		return
	}
	s.refuse(ctx, fmt.Sprintf("the event stream holds %d messages, fewer than the %d the latest signed checkpoint covers: messages were removed",
		s.tree.Size(), s.past.Size))
}

// refuse stops the signing for good, loudly: the stream no longer holds what the latest
// checkpoint signed. Signing on would bless the rewritten past; the operator must find
// out what happened (an auditor's witness holds the older checkpoints), not learn of it
// from an auditor. The stream denies deletes, so a first sequence above 1 is its
// retention (TOOLBUS_RETENTION) having dropped the oldest events: the reason says so.
func (s *Service) refuse(ctx context.Context, reason string) {
	s.refused = true
	if es := s.Bus.EventStream(); es != nil {
		if info, err := es.Info(ctx); err == nil && info.State.FirstSeq > 1 {
			reason += fmt.Sprintf(" (or expired: the stream's first message is now sequence %d, its retention dropped the ones before)", info.State.FirstSeq)
		}
	}
	s.Log.Error("checkpoint: signing STOPPED: "+reason+"; no checkpoint is signed from now on and every run's verify fails its checkpoint check (keep the stream and bucket "+Bucket+" for the audit)",
		"size", s.past.Size)
	if s.Metrics != nil {
		s.Metrics.CheckpointsRefused(reason)
	}
}

// sign signs and stores the tree's head when it grew.
func (s *Service) sign(ctx context.Context) {
	n := s.tree.Size()
	signer := s.Bus.Signer()
	if n == s.signed || signer == nil || s.refused || s.past != nil && n < s.past.Size {
		return
	}
	root, err := s.tree.Root(n)
	if err == nil {
		var note string
		if note, err = (Checkpoint{Origin: Origin(s.Bus.Config().Stream), Size: n, Root: root}).Sign(signer); err == nil {
			err = Put(ctx, s.Bus.JetStream(), note)
		}
	}
	if err != nil {
		s.Log.Warn("checkpoint: not signed", "size", n, "error", err)
		return
	}
	s.signed, s.due = n, false
	if s.Metrics != nil {
		s.Metrics.CheckpointSigned(n)
	}
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
