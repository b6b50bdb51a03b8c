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

// Prove reads the stream up to the latest checkpoint's size, checks that it hashes to
// the checkpoint's root, and returns the proofs of the messages of seqs the checkpoint
// covers (those after it have none). ErrNone when no checkpoint was signed.
func Prove(ctx context.Context, b *events.Bus, seqs []uint64) (*Proofs, error) {
	signed, err := Latest(ctx, b.JetStream())
	if err != nil {
		return nil, err
	}
	c, err := body(signed)
	if err != nil {
		return nil, err
	}
	tree, at, err := readTree(ctx, b, c.Size)
	if err != nil {
		return nil, err
	}
	if tree.Size() < c.Size {
		return nil, fmt.Errorf("%w: it covers %d messages, the stream holds %d (removed)", ErrRewritten, c.Size, tree.Size())
	}
	if root, err := tree.Root(c.Size); err != nil || root != c.Root {
		return nil, fmt.Errorf("%w: its first %d messages do not hash to the checkpoint's root (a message removed, altered or moved)", ErrRewritten, c.Size)
	}
	p := &Proofs{Checkpoint: signed}
	for _, seq := range seqs {
		i, ok := at[seq]
		if !ok {
			continue
		}
		proof, err := tree.Prove(i, c.Size)
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

// readTree reads the first n messages of the stream (fewer when it holds fewer) into a
// tree, with each one's leaf index by sequence.
func readTree(ctx context.Context, b *events.Bus, n int64) (*Tree, map[uint64]int64, error) {
	tree, at := &Tree{}, map[uint64]int64{}
	if n == 0 {
		return tree, at, nil
	}
	_, err := newReader(b).from(ctx, 1, func(seq uint64, h nats.Header, data []byte) bool {
		if tree.Size() < n {
			at[seq] = tree.Size()
			tree.Append(LeafHash(h, data))
		}
		return tree.Size() >= n
	})
	return tree, at, err
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
