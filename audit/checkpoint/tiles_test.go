package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/seal"
)

// TestCheckpointTiles: a tree's tiles stored in batches (tlog.NewTiles since the last
// batch, one KV write each and one for key tiles) load back to the same tree, with the
// leaf-sequence spans of a tree begun at sequence 40 with a gap, and a batch of a writer
// lagging behind changes none of them; a level-0 tile, the
// rightmost (partial) one, a level-1 tile altered, and a tile cut short each fail the
// load naming that tile. CONTROL: the untouched tiles load, before and after.
func TestCheckpointTiles(t *testing.T) {
	bus := eventstest.Setup(t, events.Config{})
	ctx := eventstest.Context(t, time.Minute)
	kv, err := bus.JetStream().KeyValue(ctx, Bucket)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := seal.NewKeyFile("role.injector")
	st := newState(LeafHash)
	var kept int64
	save := func(n int64) int {
		t.Helper()
		for st.tree.Size() < n {
			seq := uint64(40 + st.tree.Size())
			if st.tree.Size() >= 300 {
				seq += 5 // five messages the tree never took
			}
			if why := st.add(seq, map[string][]string{"ce-id": {fmt.Sprint(seq)}}, nil); why != "" {
				t.Fatal(why)
			}
		}
		root, _ := st.tree.Root(n)
		note, err := Checkpoint{Origin: Origin("TOOLBUS"), Size: n, Root: root}.Sign(seal.SignerOf(key))
		if err != nil {
			t.Fatal(err)
		}
		writes, err := saveTiles(ctx, kv, &st.tree, min(kept, n-50), n, note, st.at)
		if err != nil {
			t.Fatal(err)
		}
		kept = max(kept, n)
		return writes
	}
	if w := save(600); w != 5 { // tile/8/0/000, 001, 002 (partial), tile/8/1/000 (partial), key tiles
		t.Fatalf("the first batch wrote %d", w)
	}
	if w := save(700); w != 2 { // tile/8/0/002 (partial, longer), key tiles
		t.Fatalf("a batch of 100 leaves wrote %d", w)
	}
	save(650) // an injector beside, lagging behind: it shortens no tile, lowers no size
	load := func() (*Tree, *tilesMeta, error) {
		ts, err := openTiles(ctx, bus.JetStream())
		if err != nil {
			t.Fatal(err)
		}
		m, err := ts.meta(ctx)
		if err != nil || m == nil {
			t.Fatalf("key tiles: %v", err)
		}
		tree, err := ts.load(ctx, m)
		return tree, m, err
	}
	control := func() {
		t.Helper()
		tree, m, err := load()
		if err != nil || m.Size != 700 || tree.Size() != 700 {
			t.Fatalf("control: %v", err)
		}
		for _, c := range []struct {
			leaf int64
			seq  uint64
		}{{0, 40}, {299, 339}, {300, 345}, {699, 744}} {
			if got := m.Spans.seqOf(c.leaf); got != c.seq {
				t.Fatalf("leaf %d is sequence %d, want %d", c.leaf, got, c.seq)
			}
			if i, ok := m.Spans.leafOf(c.seq, m.Size); !ok || i != c.leaf {
				t.Fatalf("sequence %d is leaf %d (%v), want %d", c.seq, i, ok, c.leaf)
			}
		}
		if _, ok := m.Spans.leafOf(342, m.Size); ok {
			t.Fatal("a sequence the tree never took is a leaf")
		}
	}
	control()
	for _, c := range []struct {
		key  string
		edit func([]byte) []byte
	}{
		{"tile/8/0/001", flip},
		{"tile/8/0/002", flip},
		{"tile/8/1/000", flip},
		{"tile/8/0/000", func(b []byte) []byte { return b[:100] }},
	} {
		e, err := kv.Get(ctx, c.key)
		if err != nil {
			t.Fatal(err)
		}
		orig := e.Value()
		if _, err := kv.Put(ctx, c.key, c.edit(bytes.Clone(orig))); err != nil {
			t.Fatal(err)
		}
		if _, _, err := load(); !errors.Is(err, ErrTiles) || !strings.Contains(err.Error(), c.key+" of bucket") {
			t.Fatalf("%s altered: %v", c.key, err)
		} else {
			t.Log(err)
		}
		if _, err := kv.Put(ctx, c.key, orig); err != nil {
			t.Fatal(err)
		}
	}
	control()
}

func flip(b []byte) []byte {
	b[len(b)-1] ^= 1
	return b
}
