package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
)

// Instance is the heartbeat record of one executor process in the instances bucket
// (key = InstanceKey(name)). It disappears TTL after the last heartbeat.
type Instance struct {
	Name        string    `json:"name"`
	Tools       []string  `json:"tools"`
	Concurrency int       `json:"concurrency"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
}

// InstanceKey maps an instance name to its key in the instances bucket (injective).
func InstanceKey(name string) string { return kvSafe(name) }

// PutInstance records (or refreshes) the heartbeat of an executor instance.
func (b *Bus) PutInstance(ctx context.Context, in Instance) error {
	if _, err := b.instances.Put(ctx, InstanceKey(in.Name), mustJSON(in)); err != nil {
		return fmt.Errorf("events: instance heartbeat %s: %w", in.Name, err)
	}
	return nil
}

// DeleteInstance removes an instance at shutdown, so the catalog drops it at once.
func (b *Bus) DeleteInstance(ctx context.Context, name string) error {
	if err := b.instances.Delete(ctx, InstanceKey(name)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("events: delete instance %s: %w", name, err)
	}
	return nil
}

// InstanceAlive reports whether an instance heartbeated within the instance TTL.
func (b *Bus) InstanceAlive(ctx context.Context, name string) (bool, error) {
	_, err := b.instances.Get(ctx, InstanceKey(name))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("events: instance %s: %w", name, err)
	}
}

// Instances lists the live executor instances, sorted by name.
func (b *Bus) Instances(ctx context.Context) ([]Instance, error) {
	lister, err := b.instances.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("events: list instances: %w", err)
	}
	defer lister.Stop() //nolint:errcheck // nothing to do
	var out []Instance
	for k := range lister.Keys() {
		var in Instance
		if err := b.getJSON(ctx, b.instances, k, &in); err != nil {
			continue // expired between list and get
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// InstanceTTL is how long an instance stays live after its last heartbeat.
func (b *Bus) InstanceTTL() time.Duration { return b.cfg.InstanceTTL }

// Claim is an executor's claim on one call, taken before the tool runs.
type Claim struct {
	Instance string    `json:"instance"`
	Attempt  int       `json:"attempt"`
	At       time.Time `json:"at"`
}

// ErrClaimed is returned by ClaimCall when another execution holds the claim.
var ErrClaimed = errors.New("events: call already claimed")

// ClaimKey is the key of a call's claim: <run>.<step>.<call_id> (call id made key-safe).
func ClaimKey(run string, step int, callID string) string {
	return run + "." + strconv.Itoa(step) + "." + kvSafe(callID)
}

// ClaimCall claims a call for c.Instance. When the call is already claimed it returns
// the current claim, its revision and ErrClaimed; TakeOverClaim then replaces it only if
// it is still that revision.
func (b *Bus) ClaimCall(ctx context.Context, run string, step int, callID string, c Claim) (Claim, uint64, error) {
	key := ClaimKey(run, step, callID)
	rev, err := b.claims.Create(ctx, key, mustJSON(c))
	if err == nil {
		return c, rev, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return c, 0, fmt.Errorf("events: claim %s: %w", key, err)
	}
	e, err := b.claims.Get(ctx, key)
	if err != nil {
		return c, 0, fmt.Errorf("events: read claim %s: %w", key, err)
	}
	var cur Claim
	if err := json.Unmarshal(e.Value(), &cur); err != nil {
		return c, 0, fmt.Errorf("events: decode claim %s: %w", key, err)
	}
	return cur, e.Revision(), ErrClaimed
}

// TakeOverClaim replaces the claim at revision rev with c (compare-and-set): the
// executor that held it died. ErrConflict when someone else took it over first.
func (b *Bus) TakeOverClaim(ctx context.Context, run string, step int, callID string, c Claim, rev uint64) error {
	key := ClaimKey(run, step, callID)
	if _, err := b.claims.Update(ctx, key, mustJSON(c), rev); err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			return fmt.Errorf("%w: claim %s: %w", ErrConflict, key, err)
		}
		return fmt.Errorf("events: take over claim %s: %w", key, err)
	}
	return nil
}

// ReleaseClaim removes a call's claim: the call did not run (it waits for approval) and
// its re-issue must be able to claim it.
func (b *Bus) ReleaseClaim(ctx context.Context, run string, step int, callID string) error {
	if err := b.claims.Delete(ctx, ClaimKey(run, step, callID)); err != nil {
		return fmt.Errorf("events: release claim: %w", err)
	}
	return nil
}

// ToolQueue describes one tool's queue: its pending and in-flight calls.
type ToolQueue struct {
	Tool       string `json:"tool"`
	Pending    uint64 `json:"pending"`
	InFlight   int    `json:"in_flight"`
	Redelivers int    `json:"redelivered"`
}

// ToolQueueInfo reads the consumer of a tool's queue. ErrNotFound when no executor ever
// served the tool.
func (b *Bus) ToolQueueInfo(ctx context.Context, tool string) (ToolQueue, error) {
	c, err := b.Stream.Consumer(ctx, ToolConsumer(tool))
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return ToolQueue{Tool: tool}, fmt.Errorf("%w: queue of %s", ErrNotFound, tool)
		}
		return ToolQueue{Tool: tool}, fmt.Errorf("events: queue of %s: %w", tool, err)
	}
	ci := c.CachedInfo()
	return ToolQueue{Tool: tool, Pending: ci.NumPending, InFlight: ci.NumAckPending, Redelivers: ci.NumRedelivered}, nil
}

// Contracts lists every tool contract in the catalog, sorted by name, whether or not an
// instance serves it now.
func (b *Bus) Contracts(ctx context.Context) ([]toolbus.ToolContract, error) {
	lister, err := b.tools.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("events: list catalog: %w", err)
	}
	defer lister.Stop() //nolint:errcheck // nothing to do
	var out []toolbus.ToolContract
	for k := range lister.Keys() {
		var tc toolbus.ToolContract
		if err := b.getJSON(ctx, b.tools, k, &tc); err != nil {
			continue
		}
		out = append(out, tc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// A run's calls in flight across the fleet are bounded by slots: keys <run>.slot.<i>
// (i < the cap) in the claims bucket, each created by the executor that runs a call of
// the run and deleted when the call ends. Distinct keys never contend, so taking a slot
// is one KV create when the run is under its cap.

// runSlot is the value of a slot key.
type runSlot struct {
	Instance string `json:"instance"`
	Call     string `json:"call"`
}

func slotKey(run string, i int) string { return run + ".slot." + strconv.Itoa(i) }

// slotTries bounds the creates tried per acquisition: a run near its cap may be told it
// is full while a slot is free; the call is then handed back and tried again.
const slotTries = 8

// AcquireRunSlot takes one of the cap slots of run for a call (key is the call's claim
// key). It returns the slot and true, or false when the run has cap calls in flight.
// Slots held by instances that are no longer alive are taken over.
func (b *Bus) AcquireRunSlot(ctx context.Context, run string, limit int, key, instance string) (int, bool, error) {
	val := mustJSON(runSlot{Instance: instance, Call: key})
	start := int(fnv32(key) % uint32(limit))
	tries := min(limit, slotTries)
	for j := 0; j < tries; j++ {
		i := (start + j) % limit
		if _, err := b.claims.Create(ctx, slotKey(run, i), val); err == nil {
			return i, true, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, false, fmt.Errorf("events: run slot %s: %w", slotKey(run, i), err)
		}
	}
	// Full: free the slots of executors that died holding them.
	alive := map[string]bool{}
	for j := 0; j < tries; j++ {
		i := (start + j) % limit
		e, err := b.claims.Get(ctx, slotKey(run, i))
		if err != nil {
			continue // released meanwhile: the next acquisition gets it
		}
		var s runSlot
		if json.Unmarshal(e.Value(), &s) != nil {
			continue
		}
		ok, seen := alive[s.Instance]
		if !seen {
			if ok, err = b.InstanceAlive(ctx, s.Instance); err != nil {
				return 0, false, err
			}
			alive[s.Instance] = ok
		}
		if !ok {
			if _, err := b.claims.Update(ctx, slotKey(run, i), val, e.Revision()); err == nil {
				return i, true, nil
			}
		}
	}
	return 0, false, nil
}

// ReleaseRunSlot frees a slot taken by AcquireRunSlot.
func (b *Bus) ReleaseRunSlot(ctx context.Context, run string, slot int) error {
	if err := b.claims.Delete(ctx, slotKey(run, slot)); err != nil {
		return fmt.Errorf("events: release run slot %s: %w", slotKey(run, slot), err)
	}
	return nil
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}
