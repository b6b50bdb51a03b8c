// Package checkpoint keeps a Merkle tree over the event stream and signs its head as a
// checkpoint (C2SP tlog-checkpoint in a C2SP signed note; golang.org/x/mod/sumdb/tlog
// and note), so that a run removed whole or a rewritten past is detected: the leaves
// are every stored message's digest (events/seal.Digest) in stream order, and an
// exported run carries the inclusion proof of each of its events in a signed tree. The
// tree's hashes are stored beside the checkpoints as tiles (tiles.go), so that it
// outlives the events' retention.
package checkpoint

import (
	"encoding/hex"
	"fmt"
	"strings"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/toolbus/toolbus/events/seal"
)

// LeafHash is the leaf of a stored message (header h, data): the tlog record hash
// (SHA-256 of 0x00 and the record) of the 32 bytes of its digest.
func LeafHash(h map[string][]string, data []byte) tlog.Hash {
	d := seal.Digest(h, data)
	raw, err := hex.DecodeString(strings.TrimPrefix(d, seal.DigestPrefix))
	if err != nil {
		panic("checkpoint: seal.Digest is not hex: " + d)
	}
	return tlog.RecordHash(raw)
}

// signedLeaf is the leaf the service appends for a stored message: the tlog record hash
// of the material its signature claims (seal.SignedMaterial, no hashing of the event
// again: a third of the service's cost was that), LeafHash's for an unsigned one. For
// an event whose signature verifies the two are the same; for one whose envelope lies
// they differ, and that event already fails its signature. A verifier never takes the
// claim: it computes LeafHash of each event and checks its inclusion, so an event
// altered under its old envelope fails twice. What the service's own check of the past
// sees (Service.add) is every message kept, removed, moved or re-signed.
func signedLeaf(h map[string][]string, data []byte) tlog.Hash {
	if m, ok := seal.SignedMaterial(h); ok {
		return tlog.RecordHash(m[:])
	}
	return LeafHash(h, data)
}

// Tree is a Merkle tree in memory: the stored hashes of tlog (about two per leaf).
type Tree struct {
	stored []tlog.Hash
	n      int64
}

// ReadHashes is tlog.HashReader.
func (t *Tree) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		if x < 0 || x >= int64(len(t.stored)) {
			return nil, fmt.Errorf("checkpoint: hash %d of %d", x, len(t.stored))
		}
		out[i] = t.stored[x]
	}
	return out, nil
}

// Append adds a leaf.
func (t *Tree) Append(leaf tlog.Hash) {
	hs, err := tlog.StoredHashesForRecordHash(t.n, leaf, t)
	if err != nil {
		panic("checkpoint: " + err.Error()) // only a hash index out of range: a bug
	}
	t.stored = append(t.stored, hs...)
	t.n++
}

// Size is the number of leaves.
func (t *Tree) Size() int64 { return t.n }

// Root is the tree hash of the first n leaves.
func (t *Tree) Root(n int64) (tlog.Hash, error) { return tlog.TreeHash(n, t) }

// Prove is the inclusion proof of leaf i in the tree of the first n leaves.
func (t *Tree) Prove(i, n int64) (tlog.RecordProof, error) { return tlog.ProveRecord(n, i, t) }

// leaf is the hash of leaf i (i < Size).
func (t *Tree) leaf(i int64) tlog.Hash { return t.stored[tlog.StoredHashIndex(0, i)] }
