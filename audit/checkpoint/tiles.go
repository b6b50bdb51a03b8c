package checkpoint

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/tlog"
)

// The tree's hashes are stored beside its checkpoints, in the bucket's keys, so that
// they outlive the events (TOOLBUS_RETENTION): a restarted service and an export
// rebuild the tree from them and the stream's messages after their last leaf, never
// needing an expired event. The layout is C2SP tlog-tiles': the key of a tile is its
// path (tile/8/<level>/<n>, tlog.Tile.Path), each tile the 32-byte hashes of up to 256
// nodes; the rightmost, still partial, tile of a level is stored at its full path,
// shorter (its hashes are a prefix of the full tile's), so a tile is one key rewritten
// until it fills. Key "tiles" holds how many leaves they hold, the signed checkpoint of
// that size and the leaf-sequence spans (spans). The service stores them in batches
// (tlog.NewTiles since the last batch) at most once per Interval and when it stops:
// a few KV writes a minute, none per event; about 32 bytes a message, never expiring.
const (
	tileHeight = 8
	keyTiles   = "tiles"
)

// ErrTiles is wrapped by the error of stored tiles that do not hash to the checkpoint
// signed for them: a tile altered or removed (the error names it).
var ErrTiles = errors.New("the stored tiles do not match the signed checkpoint")

// tilesMeta is the value of key "tiles".
type tilesMeta struct {
	Size       int64  `json:"size"`       // leaves the tiles hold
	Checkpoint string `json:"checkpoint"` // the signed checkpoint of Size leaves
	Spans      spans  `json:"spans"`
}

// tileKey is the key of t: the path of its full tile.
func tileKey(t tlog.Tile) string {
	t.W = 1 << t.H
	return t.Path()
}

// saveTiles stores the tiles of tree's leaves from..n (n: the size of the signed
// checkpoint note), then key tiles: a read and a write per tile and for the key. Every
// write is a compare-and-set that never shortens a tile nor lowers the key's size, so
// that injectors signing side by side (each keeps the same tree) store tiles that
// agree: one lagging behind writes nothing another wrote longer already.
func saveTiles(ctx context.Context, kv jetstream.KeyValue, tree *Tree, from, n int64, note string, at spans) (int, error) {
	writes := 0
	for _, t := range tlog.NewTiles(tileHeight, from, n) {
		data, err := tlog.ReadTileData(t, tree)
		if err != nil {
			return writes, fmt.Errorf("checkpoint: tile %s: %w", t.Path(), err)
		}
		if err := putGrown(ctx, kv, tileKey(t), data, func(old []byte) bool { return bytes.HasPrefix(old, data) }); err != nil {
			return writes, fmt.Errorf("checkpoint: store tile %s: %w", tileKey(t), err)
		}
		writes++
	}
	b, err := json.Marshal(tilesMeta{Size: n, Checkpoint: note, Spans: at.upTo(n)})
	if err == nil {
		err = putGrown(ctx, kv, keyTiles, b, func(old []byte) bool {
			var m tilesMeta
			return json.Unmarshal(old, &m) == nil && m.Size >= n
		})
	}
	if err != nil {
		return writes, fmt.Errorf("checkpoint: store key %s: %w", keyTiles, err)
	}
	return writes + 1, nil
}

// putGrown writes value under key unless the stored value already holds it (holds),
// compare-and-set against the revision read.
func putGrown(ctx context.Context, kv jetstream.KeyValue, key string, value []byte, holds func(old []byte) bool) error {
	for {
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = kv.Create(ctx, key, value)
		case err != nil:
			return err
		case holds(e.Value()):
			return nil
		default:
			_, err = kv.Update(ctx, key, value, e.Revision())
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
	}
}

// tileStore reads the stored tiles.
type tileStore struct{ kv jetstream.KeyValue }

// openTiles opens the bucket's tiles (a nil store: no bucket).
func openTiles(ctx context.Context, js jetstream.JetStream) (*tileStore, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: bucket %s: %w", Bucket, err)
	}
	return &tileStore{kv: kv}, nil
}

// meta is key tiles (nil: no tiles stored, as before tiles were).
func (ts *tileStore) meta(ctx context.Context) (*tilesMeta, error) {
	if ts == nil {
		return nil, nil
	}
	e, err := ts.kv.Get(ctx, keyTiles)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: key %s: %w", keyTiles, err)
	}
	var m tilesMeta
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return nil, fmt.Errorf("%w: key %s of bucket %s: %w", ErrTiles, keyTiles, Bucket, err)
	}
	return &m, nil
}

// tile reads t's hashes (a prefix of the stored tile when t is partial).
func (ts *tileStore) tile(ctx context.Context, t tlog.Tile) ([]byte, error) {
	e, err := ts.kv.Get(ctx, tileKey(t))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s of bucket %s is missing: removed", ErrTiles, tileKey(t), Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: tile %s: %w", tileKey(t), err)
	}
	if len(e.Value()) < t.W*tlog.HashSize {
		return nil, fmt.Errorf("%w: %s of bucket %s holds %d bytes, not the %d of %d hashes: cut", ErrTiles, tileKey(t), Bucket, len(e.Value()), t.W*tlog.HashSize, t.W)
	}
	return e.Value()[:t.W*tlog.HashSize], nil
}

// load rebuilds the tree of the tiles' m.Size leaves from their level 0 and checks it
// against the checkpoint stored with them and every upper tile against it (ErrTiles,
// naming the tile, when one does not hash).
func (ts *tileStore) load(ctx context.Context, m *tilesMeta) (*Tree, error) {
	c, err := body(m.Checkpoint)
	if err != nil || c.Size != m.Size {
		return nil, fmt.Errorf("%w: key %s of bucket %s holds no checkpoint of its %d leaves", ErrTiles, keyTiles, Bucket, m.Size)
	}
	tree, upper := &Tree{}, map[tlog.Tile][]byte{}
	for _, t := range tlog.NewTiles(tileHeight, 0, m.Size) {
		data, err := ts.tile(ctx, t)
		if err != nil {
			return nil, err
		}
		if t.L > 0 {
			upper[t] = data
			continue
		}
		for i := 0; i < t.W; i++ {
			tree.Append(tlog.Hash(data[i*tlog.HashSize : (i+1)*tlog.HashSize]))
		}
	}
	if root, err := tree.Root(m.Size); err != nil || root != c.Root {
		return nil, fmt.Errorf("%w: the stored tiles' %d leaves do not hash to the checkpoint signed for them (root %s, they hash to %s): %s altered", ErrTiles, m.Size, c.Root, root, culprit(tree, upper, m.Size))
	}
	for t, data := range upper {
		if want, err := tlog.ReadTileData(t, tree); err != nil || !bytes.Equal(want, data) {
			return nil, fmt.Errorf("%w: %s of bucket %s does not hash from the tiles below it: altered", ErrTiles, tileKey(t), Bucket)
		}
	}
	return tree, nil
}

// culprit names the level-0 tile whose hash its parent tile does not hold (the rightmost
// when every parent agrees: a partial tile has no parent yet).
func culprit(tree *Tree, upper map[tlog.Tile][]byte, n int64) string {
	tiles := slices.SortedFunc(maps.Keys(upper), func(a, b tlog.Tile) int { return cmp.Compare(a.N, b.N) })
	for _, t := range tiles {
		data := upper[t]
		if t.L != 1 {
			continue
		}
		want, err := tlog.ReadTileData(t, tree)
		for j := 0; err == nil && j < t.W; j++ {
			if !bytes.Equal(want[j*tlog.HashSize:(j+1)*tlog.HashSize], data[j*tlog.HashSize:(j+1)*tlog.HashSize]) {
				child := tlog.Tile{H: tileHeight, L: 0, N: t.N<<tileHeight + int64(j), W: 1 << tileHeight}
				return fmt.Sprintf("%s of bucket %s (or its hash in %s)", tileKey(child), Bucket, tileKey(t))
			}
		}
	}
	last := tlog.Tile{H: tileHeight, L: 0, N: (n - 1) >> tileHeight}
	return fmt.Sprintf("%s of bucket %s", tileKey(last), Bucket)
}

// stored reads the latest signed checkpoint ("": none) and the stored tiles (nil: none)
// with the tree of their leaves, checked against the checkpoint signed for them and
// against the latest (ErrTiles). When key latest is gone, the tiles' checkpoint is the
// latest.
func stored(ctx context.Context, js jetstream.JetStream) (string, *tilesMeta, *Tree, error) {
	signed, err := Latest(ctx, js)
	if err != nil && !errors.Is(err, ErrNone) {
		return "", nil, nil, err
	}
	ts, err := openTiles(ctx, js)
	if err != nil {
		return "", nil, nil, err
	}
	m, err := ts.meta(ctx)
	if err != nil || m == nil {
		return signed, nil, nil, err
	}
	tree, err := ts.load(ctx, m)
	if err != nil {
		return "", nil, nil, err
	}
	if signed == "" {
		return m.Checkpoint, m, tree, nil
	}
	c, err := body(signed)
	if err != nil {
		return "", nil, nil, err
	}
	if c.Size > m.Size {
		return signed, m, tree, nil // the stream's messages after the tiles' leaves check the rest
	}
	// An older latest (an injector signing beside another put it last) is a prefix
	// of the tiles' tree; the tiles' checkpoint is then the latest.
	if root, err := tree.Root(c.Size); err != nil || root != c.Root {
		return "", nil, nil, fmt.Errorf("%w: the latest checkpoint (%d messages, root %s) is not in the tree of the tiles' %d leaves (they hash to %s there): key %s of bucket %s replaced, or the tiles altered",
			ErrTiles, c.Size, c.Root, m.Size, root, keyLatest, Bucket)
	}
	return m.Checkpoint, m, tree, nil
}
