package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Outputs too large for an event live in the KV bucket toolbus_outputs, cut in chunks:
// <tool>.<run>.<step>.<call_id>.<i> for the chunks, then <tool>.<run>.<step>.<call_id>.meta
// (size, chunk count, SHA-256), written last. The tool comes first so that a subject
// permission ($KV.toolbus_outputs.<tool>.>) lets a team's executors write the outputs of
// its tools only: no team can overwrite another's output, and nobody but the admin may
// purge the bucket (writing never needs the stream purge an object store put does).

// OutputChunk is the size of the chunks of a stored output: well under the server's
// default max_payload (1 MiB).
const OutputChunk = 128 << 10

// OutputRefPrefix starts the reference of an output kept by PutOutput.
const OutputRefPrefix = "kv://" + BucketOutputs + "/"

// ErrOutputsFull wraps a PutOutput the bucket refused because it holds its
// TOOLBUS_OUTPUTS_MAX_BYTES.
var ErrOutputsFull = errors.New("store: the outputs bucket is full (TOOLBUS_OUTPUTS_MAX_BYTES)")

// outputsFull wraps err with ErrOutputsFull when the bucket refused a write for its
// byte bound.
func outputsFull(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "maximum bytes exceeded") {
		return fmt.Errorf("%w: %w", ErrOutputsFull, err)
	}
	return err
}

// outputMeta is the value of an output's .meta key.
type outputMeta struct {
	Size   int    `json:"size"`
	Chunks int    `json:"chunks"`
	SHA256 string `json:"sha256"`
}

// OutputKey is the key prefix of the output of a call: <tool>.<run>.<step>.<call_id>.
func OutputKey(tool, run string, step int, callID string) string {
	return tool + "." + run + "." + strconv.Itoa(step) + "." + kvSafe(callID)
}

// PutOutput keeps the whole output of a call (tool is the token of the queue the call
// came from) and returns its reference ("kv://toolbus_outputs/<key>"). Writing it again
// (a call that ran again) replaces it.
func (s *Store) PutOutput(ctx context.Context, tool, run string, step int, callID string, data []byte) (string, error) {
	return s.put(ctx, OutputKey(tool, run, step, callID), data)
}

// put keeps data in chunks under key, then its meta.
func (s *Store) put(ctx context.Context, key string, data []byte) (string, error) {
	n := 0
	for off := 0; off < len(data) || n == 0; off += OutputChunk {
		end := min(off+OutputChunk, len(data))
		if _, err := s.outputs.Put(ctx, key+"."+strconv.Itoa(n), data[off:end]); err != nil {
			return "", fmt.Errorf("store: put output %s: %w", key, outputsFull(err))
		}
		n++
	}
	sum := sha256.Sum256(data)
	if _, err := s.outputs.Put(ctx, key+".meta", mustJSON(outputMeta{Size: len(data), Chunks: n, SHA256: hex.EncodeToString(sum[:])})); err != nil {
		return "", fmt.Errorf("store: put output %s: %w", key, outputsFull(err))
	}
	return OutputRefPrefix + key, nil
}

// PutAttachment keeps attachment i of a call's result (toolbus.Attachment) as PutOutput
// keeps its output, under the output's key with .a<i> added, and returns its reference.
func (s *Store) PutAttachment(ctx context.Context, tool, run string, step int, callID string, i int, data []byte) (string, error) {
	return s.put(ctx, OutputKey(tool, run, step, callID)+".a"+strconv.Itoa(i), data)
}

// ErrOutputCorrupt: the chunks of a stored output do not match its checksum.
var ErrOutputCorrupt = errors.New("store: stored output does not match its checksum")

// Output reads a whole output kept by PutOutput, by its reference (or its key).
func (s *Store) Output(ctx context.Context, ref string) ([]byte, error) {
	key := strings.TrimPrefix(ref, OutputRefPrefix)
	var m outputMeta
	if err := s.getJSON(ctx, s.outputs, key+".meta", &m); err != nil {
		return nil, fmt.Errorf("store: get output %s: %w", key, err)
	}
	var buf bytes.Buffer
	buf.Grow(m.Size)
	for i := 0; i < m.Chunks; i++ {
		e, err := s.outputs.Get(ctx, key+"."+strconv.Itoa(i))
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return nil, fmt.Errorf("%w: output %s chunk %d", ErrNotFound, key, i)
			}
			return nil, fmt.Errorf("store: get output %s: %w", key, err)
		}
		buf.Write(e.Value())
	}
	sum := sha256.Sum256(buf.Bytes())
	if hex.EncodeToString(sum[:]) != m.SHA256 || buf.Len() != m.Size {
		return nil, fmt.Errorf("%w: %s", ErrOutputCorrupt, key)
	}
	return buf.Bytes(), nil
}
