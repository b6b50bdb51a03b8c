package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events/seal"
)

// Bucket is the core's bucket of checkpoints: the latest signed checkpoint of the
// event stream under key "latest", its history the earlier ones. Only the core (the
// process that signs them) and the administrator write it; a tenant account does not
// see it (no export names it), so no team or client can.
const Bucket = seal.BucketCheckpoints

const keyLatest = "latest"

// ErrNone: no checkpoint was ever signed.
var ErrNone = errors.New("checkpoint: none signed yet")

// Put stores a signed checkpoint as the latest, creating the bucket when missing.
func Put(ctx context.Context, js jetstream.JetStream, signed string) error {
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: Bucket, History: 64,
			Description: "toolbus: signed checkpoints of the event stream (audit/checkpoint)"})
	}
	if err != nil {
		return fmt.Errorf("checkpoint: bucket %s: %w", Bucket, err)
	}
	if _, err := kv.Put(ctx, keyLatest, []byte(signed)); err != nil {
		return fmt.Errorf("checkpoint: store: %w", err)
	}
	return nil
}

// Latest returns the latest signed checkpoint (ErrNone: none).
func Latest(ctx context.Context, js jetstream.JetStream) (string, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return "", ErrNone
	}
	if err != nil {
		return "", fmt.Errorf("checkpoint: bucket %s: %w", Bucket, err)
	}
	e, err := kv.Get(ctx, keyLatest)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", ErrNone
	}
	if err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	return string(e.Value()), nil
}

// body is the checkpoint a signed note carries, unverified (the signer reading its own,
// an exporter reading what it exports: the verifier opens it with the keys).
func body(signed string) (Checkpoint, error) {
	text, _, ok := strings.Cut(signed, "\n\n")
	if !ok {
		return Checkpoint{}, fmt.Errorf("%w: not a signed note", ErrCheckpoint)
	}
	return parse(text + "\n")
}
