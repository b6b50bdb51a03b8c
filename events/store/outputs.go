package store

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// PutOutput keeps a whole tool output in the object store and returns its reference
// ("objectstore://toolbus_outputs/<name>").
func (s *Store) PutOutput(ctx context.Context, name string, data []byte) (string, error) {
	if _, err := s.outputs.PutBytes(ctx, name, data); err != nil {
		return "", fmt.Errorf("store: put output %s: %w", name, err)
	}
	return OutputRefPrefix + name, nil
}

// OutputRefPrefix starts the reference of an output kept in the object store.
const OutputRefPrefix = "objectstore://" + BucketOutputs + "/"

// Output reads a whole output kept by PutOutput.
func (s *Store) Output(ctx context.Context, ref string) ([]byte, error) {
	name := ref
	if len(ref) > len(OutputRefPrefix) && ref[:len(OutputRefPrefix)] == OutputRefPrefix {
		name = ref[len(OutputRefPrefix):]
	}
	info, err := s.outputs.GetInfo(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("store: get output %s: %w", name, err)
	}
	// The chunks are read with direct gets, not with the object store's reader, which
	// is a consumer: readers create none (a consumer counts toward the stream's limit).
	st, err := s.stream(ctx, "OBJ_"+BucketOutputs)
	if err != nil {
		return nil, err
	}
	chunks := "$O." + BucketOutputs + ".C." + info.NUID
	data := make([]byte, 0, info.Size)
	for seq, n := uint64(1), uint32(0); n < info.Chunks; n++ {
		raw, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(chunks))
		if err != nil {
			return nil, fmt.Errorf("store: get output %s: chunk %d of %d: %w", name, n+1, info.Chunks, err)
		}
		data = append(data, raw.Data...)
		seq = raw.Sequence + 1
	}
	if uint64(len(data)) != info.Size {
		return nil, fmt.Errorf("store: get output %s: read %d bytes, want %d", name, len(data), info.Size)
	}
	if want, ok := strings.CutPrefix(info.Digest, "SHA-256="); ok {
		sum := sha256.Sum256(data)
		if base64.URLEncoding.EncodeToString(sum[:]) != want {
			return nil, fmt.Errorf("store: get output %s: digest mismatch", name)
		}
	}
	return data, nil
}
