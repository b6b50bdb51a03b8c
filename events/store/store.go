package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
)

// Names of the buckets.
const (
	BucketTools     = "toolbus_tools"
	BucketHistory   = "toolbus_history"
	BucketRuns      = "toolbus_runs"
	BucketApprovals = "toolbus_approvals"
	// BucketOutputs holds whole outputs too large for an event (see PutOutput).
	BucketOutputs = "toolbus_outputs"
	// BucketClaims holds one key per call that an executor claimed before running it,
	// and the run slots.
	BucketClaims = "toolbus_claims"
	// BucketInstances holds one key per live executor instance, refreshed by heartbeats
	// and expired by the bucket's TTL.
	BucketInstances = "toolbus_instances"
	// BucketSecrets holds what a deployment's executors share and no other role may
	// read: the OAuth tokens of MCP servers, one key per team and server (SecretKey).
	BucketSecrets = "toolbus_secrets"
)

// Buckets are the handles a Store works on.
type Buckets struct {
	History, Runs, Tools, Approvals, Claims, Instances, Outputs jetstream.KeyValue
	// Conn, when set, lets the store read the results of a step with one batched
	// direct get instead of one read per result.
	Conn *nats.Conn
	// JS lists buckets with direct gets, without a consumer (Runs, Contracts,
	// Instances, WatchCatalog).
	JS jetstream.JetStream
}

// Store reads and writes the shared state. It is safe for concurrent use.
type Store struct {
	history     jetstream.KeyValue
	runs        jetstream.KeyValue
	tools       jetstream.KeyValue
	approvals   jetstream.KeyValue
	claims      jetstream.KeyValue
	instances   jetstream.KeyValue
	outputs     jetstream.KeyValue
	instanceTTL time.Duration
	conn        *nats.Conn
	// batchOffUntil: batched reads are not tried before this time (unix ns).
	batchOffUntil atomic.Int64
	batch         batchMux
	js            jetstream.JetStream
	streams       sync.Map // bucket -> jetstream.Stream
	// written: the run states this store wrote last (setRunState's first attempt).
	written writtenStates
}

// New returns a Store over opened buckets; instanceTTL is the TTL of the instances
// bucket (executors heartbeat every third of it).
func New(b Buckets, instanceTTL time.Duration) *Store {
	return &Store{history: b.History, runs: b.Runs, tools: b.Tools, approvals: b.Approvals,
		claims: b.Claims, instances: b.Instances, outputs: b.Outputs, instanceTTL: instanceTTL, conn: b.Conn, js: b.JS}
}

// Errors callers branch on.
var (
	// ErrRunNotFound: no run.started event for that run id.
	ErrRunNotFound = errors.New("store: run not found")
	// ErrRunEnded: the run already reached a terminal state; nothing may move it back.
	ErrRunEnded = errors.New("store: run already ended")
	// ErrConflict: a compare-and-set lost against a concurrent writer; reload and retry.
	ErrConflict = errors.New("store: concurrent update")
	// ErrNotFound: the requested record does not exist (yet).
	ErrNotFound = errors.New("store: not found")
)

func stepKey(run string, step int, kind string) string {
	return run + "." + strconv.Itoa(step) + "." + kind
}

func (s *Store) getJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) error {
	e, err := kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return fmt.Errorf("store: get %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return fmt.Errorf("store: decode %s: %w", key, err)
	}
	return nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("store: marshal %T: %v", v, err)) // only plain data types reach here
	}
	return b
}

// kvSafe maps a call id (which comes from a model provider) to a valid KV key token,
// injectively: other bytes than [A-Za-z0-9_-] become =XX.
func kvSafe(s string) string {
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if toolbus.TokenByte(c) {
			out = append(out, c)
		} else {
			out = append(out, '=', hex[c>>4], hex[c&15])
		}
	}
	if len(out) == 0 {
		return "="
	}
	return string(out)
}
