package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
)

// Claim is an executor's claim on one call, taken before the tool runs. Its revision in
// the bucket is the fencing token of the attempt: every change of owner is a
// compare-and-set on it.
type Claim struct {
	// Team and Instance name the claiming executor (Instance.Team, Instance.Name): its
	// liveness is the instance record InstanceKey(Team, Instance, Boot).
	Team     string `json:"team,omitempty"`
	Instance string `json:"instance"`
	// Boot is the boot id of the claiming process (Instance.Boot).
	Boot    string    `json:"boot,omitempty"`
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	// Abandoned marks an attempt its executor gave up without a result (its lease ran
	// out mid-call): the next delivery takes the claim over at once, whether or not the
	// executor is alive.
	Abandoned bool `json:"abandoned,omitempty"`
	// Retry marks an abandoned attempt that failed and is retried by the tool's retry
	// policy (not a lost lease).
	Retry bool `json:"retry,omitempty"`
	// Retries are the failed attempts retried so far, oldest first; each take-over
	// carries them on, and the final result publishes them (ToolResult.Retries).
	Retries []toolbus.FailedAttempt `json:"retries,omitempty"`
	// Yielded marks an attempt that took the claim over and then found the call's
	// result already stored by an earlier attempt (one cut off from the bus whose
	// publication arrived late): it did not run, and that earlier result is the call's.
	// The injector reads it to tell such a result from one an attempt that runs will
	// replace.
	Yielded bool `json:"yielded,omitempty"`
	// Done marks an attempt whose result the stream stored. Executors in a team account
	// write it, since they cannot walk the stream's results to find that out (they read
	// only the last result of a tool in a run): a take-over finds the call done.
	Done bool `json:"done,omitempty"`
}

// ErrClaimed is returned by ClaimCall when another execution holds the claim.
var ErrClaimed = errors.New("store: call already claimed")

// ClaimKey is the key of a call's claim: <tool>.<run>.<step>.<call_id> (call id made
// key-safe), where tool is the subject token of the queue the call came from (the tool's
// name, or "_unknown"). The tool comes first so that a subject permission
// ($KV.toolbus_claims.<tool>.>) gives a team's executors the claims of its tools only.
func ClaimKey(tool, run string, step int, callID string) string {
	return tool + "." + run + "." + strconv.Itoa(step) + "." + kvSafe(callID)
}

// ClaimCall claims a call for c.Instance. When the call is already claimed it returns
// the current claim, its revision and ErrClaimed; TakeOverClaim then replaces it only if
// it is still that revision.
func (s *Store) ClaimCall(ctx context.Context, tool, run string, step int, callID string, c Claim) (Claim, uint64, error) {
	key := ClaimKey(tool, run, step, callID)
	rev, err := s.claims.Create(ctx, key, mustJSON(c))
	if err == nil {
		return c, rev, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return c, 0, fmt.Errorf("store: claim %s: %w", key, err)
	}
	e, err := s.claims.Get(ctx, key)
	if err != nil {
		return c, 0, fmt.Errorf("store: read claim %s: %w", key, err)
	}
	var cur Claim
	if err := json.Unmarshal(e.Value(), &cur); err != nil {
		return c, 0, fmt.Errorf("store: decode claim %s: %w", key, err)
	}
	return cur, e.Revision(), ErrClaimed
}

// TakeOverClaim replaces the claim at revision rev with c (compare-and-set) and returns
// the new revision: the executor that held it died or abandoned it. ErrConflict when
// someone else changed it first. The executor that holds a claim also uses it to mark
// its attempt abandoned.
func (s *Store) TakeOverClaim(ctx context.Context, tool, run string, step int, callID string, c Claim, rev uint64) (uint64, error) {
	key := ClaimKey(tool, run, step, callID)
	rev, err := s.claims.Update(ctx, key, mustJSON(c), rev)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			return 0, fmt.Errorf("%w: claim %s: %w", ErrConflict, key, err)
		}
		return 0, fmt.Errorf("store: take over claim %s: %w", key, err)
	}
	return rev, nil
}

// CurrentClaim returns the claim of a call and its revision (ErrNotFound when none).
func (s *Store) CurrentClaim(ctx context.Context, tool, run string, step int, callID string) (Claim, uint64, error) {
	key := ClaimKey(tool, run, step, callID)
	e, err := s.claims.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Claim{}, 0, fmt.Errorf("%w: claim %s", ErrNotFound, key)
	}
	if err != nil {
		return Claim{}, 0, fmt.Errorf("store: read claim %s: %w", key, err)
	}
	var c Claim
	if err := json.Unmarshal(e.Value(), &c); err != nil {
		return Claim{}, 0, fmt.Errorf("store: decode claim %s: %w", key, err)
	}
	return c, e.Revision(), nil
}

// ReleaseClaim removes a call's claim: the call did not run (it waits for approval) and
// its re-issue must be able to claim it.
func (s *Store) ReleaseClaim(ctx context.Context, tool, run string, step int, callID string) error {
	if err := s.claims.Delete(ctx, ClaimKey(tool, run, step, callID)); err != nil {
		return fmt.Errorf("store: release claim: %w", err)
	}
	return nil
}

// A run's calls of one tool in flight across the fleet are bounded by slots: keys
// <tool>.<run>.slot.<i> (i < the cap) in the claims bucket, each created by the executor
// that runs a call of the run and deleted when the call ends. Distinct keys never
// contend, so taking a slot is one KV create when the run is under its cap. The slots
// are per tool, like the claims, so that one team's executors cannot hold the slots
// another team's calls need.

// runSlot is the value of a slot key.
type runSlot struct {
	Team     string `json:"team,omitempty"`
	Instance string `json:"instance"`
	Boot     string `json:"boot,omitempty"`
	Call     string `json:"call"`
}

func slotKey(tool, run string, i int) string {
	return tool + "." + run + ".slot." + strconv.Itoa(i)
}

// slotTries bounds the creates tried per acquisition: a run near its cap may be told it
// is full while a slot is free; the call is then handed back and tried again.
const slotTries = 8

// AcquireRunSlot takes one of the cap slots of run and tool (the queue's token) for a
// call (key is the call's claim key). It returns the slot and true, or false when the
// run has cap calls in flight. Slots held by instances (team, name and boot id) that are
// no longer alive are taken over.
func (s *Store) AcquireRunSlot(ctx context.Context, tool, run string, limit int, key, team, instance, boot string) (int, bool, error) {
	val := mustJSON(runSlot{Team: team, Instance: instance, Boot: boot, Call: key})
	start := int(fnv32(key) % uint32(limit))
	tries := min(limit, slotTries)
	for j := 0; j < tries; j++ {
		i := (start + j) % limit
		if _, err := s.claims.Create(ctx, slotKey(tool, run, i), val); err == nil {
			return i, true, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, false, fmt.Errorf("store: run slot %s: %w", slotKey(tool, run, i), err)
		}
	}
	// Full: free the slots of executors that died holding them.
	alive := map[runSlot]bool{}
	for j := 0; j < tries; j++ {
		i := (start + j) % limit
		e, err := s.claims.Get(ctx, slotKey(tool, run, i))
		if err != nil {
			continue // released meanwhile: the next acquisition gets it
		}
		var held runSlot
		if json.Unmarshal(e.Value(), &held) != nil {
			continue
		}
		owner := runSlot{Team: held.Team, Instance: held.Instance, Boot: held.Boot}
		ok, seen := alive[owner]
		if !seen {
			if ok, err = s.InstanceAlive(ctx, held.Team, held.Instance, held.Boot); err != nil {
				return 0, false, err
			}
			alive[owner] = ok
		}
		if !ok {
			if _, err := s.claims.Update(ctx, slotKey(tool, run, i), val, e.Revision()); err == nil {
				return i, true, nil
			}
		}
	}
	return 0, false, nil
}

// ReleaseRunSlot frees a slot taken by AcquireRunSlot.
func (s *Store) ReleaseRunSlot(ctx context.Context, tool, run string, slot int) error {
	if err := s.claims.Delete(ctx, slotKey(tool, run, slot)); err != nil {
		return fmt.Errorf("store: release run slot %s: %w", slotKey(tool, run, slot), err)
	}
	return nil
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}
