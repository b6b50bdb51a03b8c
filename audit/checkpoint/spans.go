package checkpoint

import (
	"fmt"
	"sort"

	"github.com/nats-io/nats.go"
	"golang.org/x/mod/sumdb/tlog"
)

// span says that the leaves from Leaf on are the stream's messages from Seq on, one
// each, up to the next span's leaf.
type span struct {
	Leaf int64  `json:"leaf"`
	Seq  uint64 `json:"seq"`
}

// spans map the tree's leaf indexes to stream sequences, stored beside the tiles: a
// leaf is not sequence-1 once the tree began after the stream's front expired (a new
// tree) or the stream skipped a sequence before the service read it.
type spans []span

// seqOf is the stream sequence of leaf i (0 for none).
func (sp spans) seqOf(i int64) uint64 {
	k := sort.Search(len(sp), func(k int) bool { return sp[k].Leaf > i }) - 1
	if k < 0 || i < 0 {
		return 0
	}
	return sp[k].Seq + uint64(i-sp[k].Leaf)
}

// leafOf is the leaf of the message of seq among the first n leaves.
func (sp spans) leafOf(seq uint64, n int64) (int64, bool) {
	k := sort.Search(len(sp), func(k int) bool { return sp[k].Seq > seq }) - 1
	if k < 0 {
		return 0, false
	}
	i := sp[k].Leaf + int64(seq-sp[k].Seq)
	if i >= n || k+1 < len(sp) && i >= sp[k+1].Leaf {
		return 0, false
	}
	return i, true
}

// add records that leaf i is the message of seq (leaves are added in order).
func (sp *spans) add(i int64, seq uint64) {
	if n := len(*sp); n > 0 && i > 0 && (*sp).seqOf(i-1)+1 == seq {
		return
	}
	*sp = append(*sp, span{Leaf: i, Seq: seq})
}

// upTo is the spans of the first n leaves.
func (sp spans) upTo(n int64) spans {
	k := sort.Search(len(sp), func(k int) bool { return sp[k].Leaf >= n })
	return sp[:k:k]
}

// state is a tree being rebuilt and followed: its first stored leaves come from the
// stored tiles (their messages, where the stream still holds them, are checked against
// them), the rest are appended from the stream's messages after the tiles' last leaf.
type state struct {
	tree   Tree
	at     spans
	stored int64 // leaves read from the tiles
	want   int64 // the stored leaf the next message read must be (-1: none read yet)
	leaf   func(h map[string][]string, data []byte) tlog.Hash
}

func newState(leaf func(h map[string][]string, data []byte) tlog.Hash) *state {
	return &state{leaf: leaf, want: -1}
}

// add takes the stream's message of seq, read in order: a stored leaf it must be, or the
// next leaf. It says why the stream does not match the stored tree ("" when it does).
func (s *state) add(seq uint64, h nats.Header, data []byte) string {
	if i, ok := s.at.leafOf(seq, s.stored); ok {
		switch {
		case s.want >= 0 && i != s.want:
			return fmt.Sprintf("the stored tree's leaves %d to %d (sequences %d to %d) are no longer in the stream: removed", s.want, i-1, s.at.seqOf(s.want), seq-1)
		case s.leaf(h, data) != s.tree.leaf(i):
			return fmt.Sprintf("the stream's message %d is not leaf %d of the stored tree: altered, or another message moved there", seq, i)
		}
		s.want = i + 1
		return ""
	}
	if s.stored > 0 && seq <= s.at.seqOf(s.stored-1) {
		return fmt.Sprintf("the stream's message %d is no leaf of the stored tree, which holds sequence %d: inserted or moved", seq, s.at.seqOf(s.stored-1))
	}
	if why := s.short(); why != "" {
		return why
	}
	s.want = s.stored
	s.at.add(s.tree.Size(), seq)
	s.tree.Append(s.leaf(h, data))
	return ""
}

// short says which stored leaves the stream lacks after the last one read ("" none).
func (s *state) short() string {
	if s.want < 0 || s.want >= s.stored {
		return ""
	}
	return fmt.Sprintf("the stored tree's leaves %d to %d (sequences %d to %d) are no longer in the stream: removed", s.want, s.stored-1, s.at.seqOf(s.want), s.at.seqOf(s.stored-1))
}

// next is the sequence after the stored tiles' last leaf (1: none stored).
func (s *state) next() uint64 {
	if s.stored == 0 {
		return 1
	}
	return s.at.seqOf(s.stored-1) + 1
}
