package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Instance is the heartbeat record of one executor process in the instances bucket
// (key = InstanceKey(name, boot)). It disappears TTL after the last heartbeat.
type Instance struct {
	Name string `json:"name"`
	// Boot is random per process start: a process restarted under the same name (a
	// container keeps its hostname and runs as pid 1 again) is a new instance, so the
	// calls its predecessor claimed are taken over once the predecessor's record expires.
	Boot        string    `json:"boot,omitempty"`
	Tools       []string  `json:"tools"`
	Concurrency int       `json:"concurrency"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
}

// InstanceKey maps an instance (name and boot id) to its key in the instances bucket
// (injective: kvSafe escapes dots).
func InstanceKey(name, boot string) string {
	if boot == "" {
		return kvSafe(name)
	}
	return kvSafe(name) + "." + kvSafe(boot)
}

// PutInstance records (or refreshes) the heartbeat of an executor instance; it returns
// the record's revision.
func (s *Store) PutInstance(ctx context.Context, in Instance) (uint64, error) {
	rev, err := s.instances.Put(ctx, InstanceKey(in.Name, in.Boot), mustJSON(in))
	if err != nil {
		return 0, fmt.Errorf("store: instance heartbeat %s: %w", in.Name, err)
	}
	return rev, nil
}

// InstanceStoredAt returns when the server stored the instance record of name and boot
// at revision rev or later, by the server's clock: the record expires one TTL after
// that, which is what an executor's fencing deadline is measured from (see
// toolbus.ToolResult.LeaseUntil). ErrNotFound when the record is gone or older than rev
// (a read served by a replica that lags).
func (s *Store) InstanceStoredAt(ctx context.Context, name, boot string, rev uint64) (time.Time, error) {
	e, err := s.instances.Get(ctx, InstanceKey(name, boot))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return time.Time{}, fmt.Errorf("%w: instance %s", ErrNotFound, name)
	case err != nil:
		return time.Time{}, fmt.Errorf("store: instance %s: %w", name, err)
	case e.Revision() < rev:
		return time.Time{}, fmt.Errorf("%w: instance %s at revision %d (read %d)", ErrNotFound, name, rev, e.Revision())
	}
	return e.Created(), nil
}

// DeleteInstance removes an instance at shutdown, so the catalog drops it at once.
func (s *Store) DeleteInstance(ctx context.Context, name, boot string) error {
	if err := s.instances.Delete(ctx, InstanceKey(name, boot)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("store: delete instance %s: %w", name, err)
	}
	return nil
}

// InstanceAlive reports whether an instance (name and boot id) heartbeated within the
// instance TTL.
func (s *Store) InstanceAlive(ctx context.Context, name, boot string) (bool, error) {
	_, err := s.instances.Get(ctx, InstanceKey(name, boot))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("store: instance %s: %w", name, err)
	}
}

// Instances lists the live executor instances, sorted by name.
func (s *Store) Instances(ctx context.Context) ([]Instance, error) {
	var out []Instance
	err := s.walk(ctx, s.instances, func(_ string, val []byte) {
		var in Instance
		if json.Unmarshal(val, &in) == nil {
			out = append(out, in)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("store: list instances: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// InstanceTTL is how long an instance stays live after its last heartbeat.
func (s *Store) InstanceTTL() time.Duration { return s.instanceTTL }
