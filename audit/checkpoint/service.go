package checkpoint

import (
	"context"
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

	tree   Tree
	signed int64 // the size last signed
	due    bool  // a run ended since
	// past is the latest checkpoint stored when the service started: the stream must
	// still hash to it, else the past was rewritten and the service signs nothing.
	past    *Checkpoint
	refused bool
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
			s.add(h, data)
			return false
		})
		next = last + 1
		switch {
		case err != nil && ctx.Err() == nil && !warned:
			s.Log.Warn("checkpoint: reading the event stream failed (retrying)", "error", err)
			warned = true
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
func (s *Service) add(h nats.Header, data []byte) {
	s.tree.Append(LeafHash(h, data))
	if s.past != nil && s.tree.Size() == s.past.Size {
		if root, err := s.tree.Root(s.past.Size); err != nil || root != s.past.Root {
			s.refused = true
			s.Log.Error("checkpoint: the stream no longer hashes to the latest checkpoint: a message was removed or rewritten; no checkpoint is signed",
				"size", s.past.Size)
		}
	}
	if IsRunEnd(h.Get("ce-type")) {
		s.due = true
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
}

// IsRunEnd reports a run outcome's type (whose storing triggers a checkpoint).
func IsRunEnd(typ string) bool {
	for _, st := range []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled} {
		if typ == events.TypeRunEnded(st) {
			return true
		}
	}
	return false
}
