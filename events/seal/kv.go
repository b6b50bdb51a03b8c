package seal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketSigners is the core's bucket of public keys, one key per key id (its value a
// Key as JSON): written only by the administrator (toolbus admin publish-keys, whose
// credentials alone may write it), read by verifiers (toolbus replay --verify, toolbus
// audit export).
const BucketSigners = "toolbus_signers"

// BucketCheckpoints is the core's bucket of signed checkpoints of the event stream
// (audit/checkpoint): written by the injector of a process that signs, read by
// verifiers; `toolbus init` creates it.
const BucketCheckpoints = "toolbus_checkpoints"

// PublishKeyring writes every key of r into the bucket, creating it when missing. A
// key is never deleted: a retired or revoked key stays, marked so.
func PublishKeyring(ctx context.Context, js jetstream.JetStream, r Keyring) (int, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketSigners, History: 8,
		Description: "toolbus: the public halves of the signing keys (toolbus admin publish-keys)"})
	if err != nil {
		return 0, fmt.Errorf("seal: bucket %s: %w", BucketSigners, err)
	}
	n := 0
	for _, k := range r.Keys {
		b, err := json.Marshal(k)
		if err != nil {
			return n, fmt.Errorf("seal: %w", err)
		}
		if e, err := kv.Get(ctx, k.KeyID); err == nil && string(e.Value()) == string(b) {
			continue
		}
		if _, err := kv.Put(ctx, k.KeyID, b); err != nil {
			return n, fmt.Errorf("seal: publish key %s: %w", k.KeyID, err)
		}
		n++
	}
	return n, nil
}

// LoadKeyring reads every key of the bucket (an empty ring when it does not exist: no
// key was ever published).
func LoadKeyring(ctx context.Context, js jetstream.JetStream) (Keyring, error) {
	var r Keyring
	kv, err := js.KeyValue(ctx, BucketSigners)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("seal: bucket %s: %w", BucketSigners, err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return r, fmt.Errorf("seal: bucket %s: %w", BucketSigners, err)
	}
	for id := range keys.Keys() {
		e, err := kv.Get(ctx, id)
		if err != nil {
			return r, fmt.Errorf("seal: key %s: %w", id, err)
		}
		var k Key
		if err := json.Unmarshal(e.Value(), &k); err != nil {
			return r, fmt.Errorf("seal: key %s: %w", id, err)
		}
		r.Keys = append(r.Keys, k)
	}
	return r, nil
}
