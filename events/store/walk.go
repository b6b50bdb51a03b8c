package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// walk calls fn with the key and value of every live key of a bucket, in stream order.
// It reads with direct gets (the next message of the bucket from a sequence), which
// every reader may send, and creates no consumer: listing a bucket with a KV watch or
// ListKeys costs a consumer on the bucket's stream, which counts toward the stream's
// consumer limit, and a reader that may create consumers there could fill that limit
// and stop the planner and `toolbus mcp` from reading the catalog. The buckets keep one
// value per key, so each live key is read once; deleted and expired keys (markers) are
// skipped.
func (s *Store) walk(ctx context.Context, kv jetstream.KeyValue, fn func(key string, val []byte)) error {
	// Batched direct gets (up to batchMax messages each, in stream order) read the
	// whole bucket in a request or a few, whatever its size, where the server allows
	// them (one replica, direct gets on); else one direct get per key.
	vals := map[string][]byte{}
	_, err := s.readFrom(ctx, kv.Bucket(), 1, func(key string, val []byte, deleted bool) {
		// A key written again while the batches are read shows twice: the last one stands.
		if deleted {
			delete(vals, key)
		} else {
			vals[key] = val
		}
	})
	if err == nil {
		for _, k := range slices.Sorted(maps.Keys(vals)) {
			fn(k, vals[k])
		}
		return nil
	}
	st, err := s.stream(ctx, BucketStream(kv.Bucket()))
	if err != nil {
		return err
	}
	prefix := KeyPrefix(kv.Bucket())
	for seq := uint64(1); ; {
		raw, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(prefix+">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("store: read %s: %w", kv.Bucket(), err)
		}
		seq = raw.Sequence + 1
		if raw.Header.Get("KV-Operation") != "" || raw.Header.Get("Nats-Marker-Reason") != "" {
			continue // a deleted, purged or expired key
		}
		fn(raw.Subject[len(prefix):], raw.Data)
	}
}

// stream returns a bucket's stream (KV_<bucket>, OBJ_<bucket>), looked up once.
func (s *Store) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if v, ok := s.streams.Load(name); ok {
		return v.(jetstream.Stream), nil
	}
	if s.js == nil {
		return nil, fmt.Errorf("store: read %s: no JetStream handle", name)
	}
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("store: stream %s: %w", name, err)
	}
	s.streams.Store(name, st)
	return st, nil
}
