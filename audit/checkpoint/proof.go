package checkpoint

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// Proofs is the checkpoint section of an audit bundle: the signed checkpoint and the
// inclusion proof of each event of the run it covers.
type Proofs struct {
	// Checkpoint is the signed note (C2SP signed-note, tlog-checkpoint body).
	Checkpoint string `json:"checkpoint"`
	Leaves     []Leaf `json:"leaves"`
}

// Leaf is one event's place in the checkpoint's tree: its stream sequence, its leaf
// index and the inclusion proof (tlog hashes, base64), leaf to root.
type Leaf struct {
	Seq   uint64   `json:"seq"`
	Index int64    `json:"index"`
	Proof []string `json:"proof"`
}

// ErrRewritten is wrapped by Prove's error when the stream does not hash to the
// latest checkpoint: a message removed (a run removed whole among them), altered or
// moved since it was signed.
var ErrRewritten = errors.New("the stream does not match its latest signed checkpoint")

// Prove rebuilds the tree of the latest checkpoint from the stored tiles and the
// stream's messages after their last leaf (checking every message the stream still
// holds against its stored leaf), checks that it hashes to the checkpoint's root, and
// returns the proofs of the messages of seqs the checkpoint covers (those after it, or
// expired, have none). ErrNone when no checkpoint was signed; ErrTiles when the stored
// tiles do not hash to theirs; ErrRewritten when the stream does not match.
func Prove(ctx context.Context, b *events.Bus, seqs []uint64) (*Proofs, error) {
	signed, c, st, err := readTree(ctx, b)
	if err != nil {
		return nil, err
	}
	p := &Proofs{Checkpoint: signed}
	for _, seq := range seqs {
		i, ok := st.at.leafOf(seq, c.Size)
		if !ok {
			continue
		}
		proof, err := st.tree.Prove(i, c.Size)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		l := Leaf{Seq: seq, Index: i}
		for _, h := range proof {
			l.Proof = append(l.Proof, h.String())
		}
		p.Leaves = append(p.Leaves, l)
	}
	return p, nil
}

// Consistency proves that the latest checkpoint (returned, signed) extends the tree of
// the first old leaves, from the stored tiles and the stream's messages after them: a
// witness holding an older checkpoint checks the proof with tlog.CheckTree.
func Consistency(ctx context.Context, b *events.Bus, old int64) (string, tlog.TreeProof, error) {
	signed, c, st, err := readTree(ctx, b)
	if err != nil {
		return "", nil, err
	}
	proof, err := tlog.ProveTree(c.Size, old, &st.tree)
	if err != nil {
		return "", nil, fmt.Errorf("checkpoint: %d leaves in the checkpoint of %d: %w", old, c.Size, err)
	}
	return signed, proof, nil
}

// readTree reads the latest checkpoint and rebuilds its tree: the stored tiles' leaves,
// then the stream's messages after them up to the checkpoint's size.
func readTree(ctx context.Context, b *events.Bus) (string, Checkpoint, *state, error) {
	signed, m, tree, err := stored(ctx, b.JetStream())
	if err == nil && signed == "" {
		err = ErrNone
	}
	if err != nil {
		return "", Checkpoint{}, nil, err
	}
	c, err := body(signed)
	if err != nil {
		return "", c, nil, err
	}
	st := newState(LeafHash)
	if m != nil {
		st.tree, st.at, st.stored = *tree, m.Spans, m.Size
	}
	if c.Size == 0 {
		return signed, c, st, nil
	}
	var why string
	_, err = newReader(b).from(ctx, 1, func(seq uint64, h nats.Header, data []byte) bool {
		if why = st.add(seq, h, data); why != "" {
			return true
		}
		return st.tree.Size() >= c.Size && seq >= st.at.seqOf(c.Size-1)
	})
	switch {
	case err != nil:
		return "", c, nil, err
	case why != "":
		return "", c, nil, fmt.Errorf("%w: %s", ErrRewritten, why)
	case st.short() != "":
		return "", c, nil, fmt.Errorf("%w: %s", ErrRewritten, st.short())
	case st.tree.Size() < c.Size:
		return "", c, nil, fmt.Errorf("%w: it covers %d messages, the stored tiles and the stream hold %d (removed)", ErrRewritten, c.Size, st.tree.Size())
	}
	if root, err := st.tree.Root(c.Size); err != nil || root != c.Root {
		return "", c, nil, fmt.Errorf("%w: its first %d messages do not hash to the checkpoint's root (a message removed, altered or moved)", ErrRewritten, c.Size)
	}
	return signed, c, st, nil
}

// Check opens the proofs' checkpoint with the keyring and checks that it is the
// stream's (origin). It returns the checkpoint and the key id that signed it.
func (p *Proofs) Check(ring seal.Keyring, stream string) (Checkpoint, string, error) {
	c, signer, err := Open(p.Checkpoint, ring)
	if err != nil {
		return c, signer, err
	}
	if c.Origin != Origin(stream) {
		return c, signer, fmt.Errorf("%w: origin %q, not the stream's %q", ErrCheckpoint, c.Origin, Origin(stream))
	}
	return c, signer, nil
}

// Includes says why the message of seq (its leaf hash leaf) is not proven included in
// c ("" when it is): no proof, or a proof that does not lead to the root.
func (p *Proofs) Includes(c Checkpoint, seq uint64, leaf tlog.Hash) string {
	for _, l := range p.Leaves {
		if l.Seq != seq {
			continue
		}
		proof := make(tlog.RecordProof, 0, len(l.Proof))
		for _, s := range l.Proof {
			h, err := tlog.ParseHash(s)
			if err != nil {
				return fmt.Sprintf("its inclusion proof holds %q, no hash", s)
			}
			proof = append(proof, h)
		}
		if err := tlog.CheckRecord(proof, c.Size, c.Root, l.Index, leaf); err != nil {
			return fmt.Sprintf("it is not leaf %d of the checkpoint of %d messages (%v): altered, or stored elsewhere than signed", l.Index, c.Size, err)
		}
		return ""
	}
	return fmt.Sprintf("no checkpoint covers it (the checkpoint holds %d messages; export again after the next one)", c.Size)
}
