package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
)

// Names of the JetStream resources toolbus uses.
const (
	DefaultStream   = "TOOLBUS"
	BucketTools     = "toolbus_tools"
	BucketHistory   = "toolbus_history"
	BucketRuns      = "toolbus_runs"
	BucketApprovals = "toolbus_approvals"
	BucketOutputs   = "toolbus_outputs"
	// BucketClaims holds one key per call that an executor claimed before running it.
	BucketClaims = "toolbus_claims"
	// BucketInstances holds one key per live executor instance, refreshed by heartbeats
	// and expired by the bucket's TTL (Config.InstanceTTL).
	BucketInstances = "toolbus_instances"
)

// Errors callers branch on.
var (
	// ErrRunNotFound: no run.started event for that run id.
	ErrRunNotFound = errors.New("events: run not found")
	// ErrRunEnded: the run already reached a terminal state; nothing may move it back.
	ErrRunEnded = errors.New("events: run already ended")
	// ErrConflict: a compare-and-set lost against a concurrent writer; reload and retry.
	ErrConflict = errors.New("events: concurrent update")
	// ErrNotFound: the requested record does not exist (yet).
	ErrNotFound = errors.New("events: not found")
)

// Config describes the stream and buckets. Zero values take the defaults.
type Config struct {
	// Stream is the stream name (default TOOLBUS).
	Stream string `envconfig:"STREAM" default:"TOOLBUS"`
	// MaxAge is how long events are kept for audit (default 7 days).
	MaxAge time.Duration `envconfig:"RETENTION" default:"168h"`
	// Duplicates is the duplicate window of the stream (default 10 minutes).
	Duplicates time.Duration `envconfig:"DUPLICATE_WINDOW" default:"10m"`
	// Memory keeps the stream and buckets in memory instead of files (tests, benchmarks).
	Memory bool `envconfig:"MEMORY_STORAGE"`
	// Replicas of the stream and buckets (1, or 3 on a cluster).
	Replicas int `envconfig:"REPLICAS" default:"1"`
	// InstanceTTL is how long an executor instance stays in the catalog after its last
	// heartbeat (default 10s); executors heartbeat every third of it.
	InstanceTTL time.Duration `envconfig:"INSTANCE_TTL" default:"10s"`
	// OutputsMaxBytes bounds the object store of large tool outputs (default 1 GiB; -1
	// unbounded): when full, storing a new output fails instead of filling the disk.
	OutputsMaxBytes int64 `envconfig:"OUTPUTS_MAX_BYTES" default:"1073741824"`
}

func (c *Config) setDefaults() {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.MaxAge == 0 {
		c.MaxAge = 7 * 24 * time.Hour
	}
	if c.Duplicates == 0 {
		c.Duplicates = 10 * time.Minute
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.InstanceTTL <= 0 {
		c.InstanceTTL = 10 * time.Second
	}
	if c.OutputsMaxBytes == 0 {
		c.OutputsMaxBytes = 1 << 30
	}
}

func (c Config) storage() jetstream.StorageType {
	if c.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// Bus is toolbus's view of JetStream: the event stream, the shared stores (history, run
// state, approvals, tool catalog, large outputs) and publishing with deterministic ids.
// It is safe for concurrent use.
type Bus struct {
	cfg    Config
	NC     *nats.Conn
	JS     jetstream.JetStream
	Stream jetstream.Stream
	reader jetstream.Stream
	// manage: this bus was set up by an administrator (Setup) and creates or updates
	// the consumers its workers bind to; an opened one only binds.
	manage    bool
	history   jetstream.KeyValue
	runs      jetstream.KeyValue
	tools     jetstream.KeyValue
	approvals jetstream.KeyValue
	claims    jetstream.KeyValue
	instances jetstream.KeyValue
	outputs   jetstream.ObjectStore

	mu       sync.Mutex
	runCache map[string]cachedRun
}

// cachedRun is a run's first run.started and its stream sequence.
type cachedRun struct {
	rs  *toolbus.RunStarted
	seq uint64
}

// Open binds to the stream and the buckets that exist (Setup, or `toolbus init`, made
// them): it looks them up and creates or updates nothing, so a worker with
// least-privilege credentials can open the bus. A missing one is an error wrapping
// ErrNotSetUp.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Bus, error) {
	cfg.setDefaults()
	js, err := newJS(nc)
	if err != nil {
		return nil, err
	}
	return open(ctx, nc, js, cfg)
}

func newJS(nc *nats.Conn) (jetstream.JetStream, error) {
	// An async publish whose ack never comes (a stream leader lost mid-flight) must fail,
	// not wait forever: a handler stuck on it would keep its message with heartbeats.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("events: jetstream: %w", err)
	}
	return js, nil
}

func open(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, cfg Config) (*Bus, error) {
	b := &Bus{cfg: cfg, NC: nc, JS: js, runCache: map[string]cachedRun{}}
	missing := func(what, name string, err error) error {
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("%w: %s %s does not exist", ErrNotSetUp, what, name)
		}
		return fmt.Errorf("events: %s %s: %w", what, name, err)
	}
	var err error
	if b.Stream, err = js.Stream(ctx, cfg.Stream); err != nil {
		return nil, missing("stream", cfg.Stream, err)
	}
	// Readers create their ephemeral consumers on the read mirror when there is one.
	b.reader = b.Stream
	if m, err := js.Stream(ctx, ReadMirrorName(cfg.Stream)); err == nil {
		b.reader = m
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("events: stream %s: %w", ReadMirrorName(cfg.Stream), err)
	}
	for _, bk := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{
		{BucketHistory, &b.history}, {BucketRuns, &b.runs}, {BucketTools, &b.tools},
		{BucketApprovals, &b.approvals}, {BucketClaims, &b.claims}, {BucketInstances, &b.instances},
	} {
		if *bk.kv, err = js.KeyValue(ctx, bk.name); err != nil {
			return nil, missing("bucket", bk.name, err)
		}
	}
	if b.outputs, err = js.ObjectStore(ctx, BucketOutputs); err != nil {
		return nil, missing("object store", BucketOutputs, err)
	}
	return b, nil
}

// Reader is the stream readers create their ephemeral (ordered) consumers on: the read
// mirror when `toolbus init` made one (least-privilege roles may create consumers only
// there, where no worker's durable lives), else the event stream itself.
func (b *Bus) Reader() jetstream.Stream { return b.reader }

func jsonEqual(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// leaderReads returns a handle on a replicated bucket whose reads go to the stream
// leader. KV buckets turn direct gets on, which any replica answers: a follower that has
// not applied the latest writes returns stale values (a step record missing results).
// Opening a bucket turns them on again, so the setting is checked around the handle.
func leaderReads(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	name := "KV_" + bucket
	directOff := func() (bool, error) {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return false, err
		}
		c := s.CachedInfo().Config
		if !c.AllowDirect {
			return true, nil
		}
		c.AllowDirect = false
		_, err = js.UpdateStream(ctx, c)
		return false, err
	}
	for attempt := 0; attempt < 20; attempt++ {
		if _, err := directOff(); err != nil {
			return nil, fmt.Errorf("events: bucket %s: leader reads: %w", bucket, err)
		}
		k, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return nil, fmt.Errorf("events: bucket %s: %w", bucket, err)
		}
		if off, err := directOff(); err == nil && off {
			return k, nil
		}
	}
	return nil, fmt.Errorf("events: bucket %s: direct gets keep being turned on", bucket)
}

func kvTTL(name string, cfg Config) time.Duration {
	switch name {
	case BucketTools:
		return 0
	case BucketInstances:
		return cfg.InstanceTTL
	}
	return cfg.MaxAge
}

// Config returns the configuration the bus was opened with (defaults applied).
func (b *Bus) Config() Config { return b.cfg }

// Publish encodes and publishes one event and waits for the stream's acknowledgement. A
// duplicate (same id inside the duplicate window) is acknowledged and not stored again.
func (b *Bus) Publish(ctx context.Context, subject string, m Meta, data any) (*jetstream.PubAck, error) {
	msg, err := Encode(subject, m, data)
	if err != nil {
		return nil, err
	}
	InjectTrace(ctx, msg.Header) // the span of ctx parents the consumer's (no-op untraced)
	ack, err := b.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(m.ID))
	if err != nil {
		return nil, fmt.Errorf("events: publish %s: %w", m.ID, err)
	}
	return ack, nil
}

// PublishAsync encodes and publishes one event without waiting; the returned future
// resolves on the stream's acknowledgement.
func (b *Bus) PublishAsync(subject string, m Meta, data any) (jetstream.PubAckFuture, error) {
	msg, err := Encode(subject, m, data)
	if err != nil {
		return nil, err
	}
	f, err := b.JS.PublishMsgAsync(msg, jetstream.WithMsgID(m.ID))
	if err != nil {
		return nil, fmt.Errorf("events: publish %s: %w", m.ID, err)
	}
	return f, nil
}

// Source returns the CloudEvents source of a component instance.
func Source(component, instance string) string { return "/toolbus/" + component + "/" + instance }

func stepKey(run string, step int, kind string) string {
	return run + "." + strconv.Itoa(step) + "." + kind
}

// ErrRunExists: a run with that id was already submitted (at any age); a run id names
// one run forever.
var ErrRunExists = errors.New("events: run id already exists")

// StartRun submits a run: it publishes run.started, and nothing else. The injector that
// consumes the first run.started of a run id records the run and asks for step 0. An id
// that already has a run.started on the stream is refused with ErrRunExists before
// anything is published, and a publish the stream reports as a duplicate (a concurrent
// submission of the same id) is refused the same way.
func (b *Bus) StartRun(ctx context.Context, source string, rs toolbus.RunStarted) error {
	if !toolbus.ValidRunID(rs.RunID) {
		return fmt.Errorf("events: invalid run id %q: use 1-128 of [A-Za-z0-9_-]", rs.RunID)
	}
	for _, t := range rs.AllowedTools {
		if !toolbus.ValidToolName(t) {
			return fmt.Errorf("events: invalid tool name %q in allowed tools", t)
		}
	}
	if _, _, err := b.firstRunStarted(ctx, rs.RunID); err == nil {
		return fmt.Errorf("%w: %s", ErrRunExists, rs.RunID)
	} else if !errors.Is(err, ErrRunNotFound) {
		return err
	}
	if rs.StartedAt.IsZero() {
		rs.StartedAt = time.Now().UTC()
	}
	ack, err := b.Publish(ctx, SubjectRunStarted(rs.RunID), Meta{
		ID: IDRunStarted(rs.RunID), Type: TypeRunStarted, Source: source, RunID: rs.RunID,
	}, rs)
	if err != nil {
		return err
	}
	if ack.Duplicate {
		return fmt.Errorf("%w: %s (submitted concurrently)", ErrRunExists, rs.RunID)
	}
	return nil
}

// RunStarted returns the run.started data of a run: the FIRST run.started on its subject
// (a later one, forged or resubmitted, never counts), read from the stream and cached:
// it never changes.
func (b *Bus) RunStarted(ctx context.Context, run string) (*toolbus.RunStarted, error) {
	rs, _, err := b.RunStartedAt(ctx, run)
	return rs, err
}

// RunStartedAt is RunStarted with the stream sequence of that first run.started.
func (b *Bus) RunStartedAt(ctx context.Context, run string) (*toolbus.RunStarted, uint64, error) {
	b.mu.Lock()
	c, ok := b.runCache[run]
	b.mu.Unlock()
	if ok {
		return c.rs, c.seq, nil
	}
	rs, seq, err := b.firstRunStarted(ctx, run)
	if err != nil {
		return nil, 0, err
	}
	b.mu.Lock()
	if len(b.runCache) > 10000 {
		clear(b.runCache) // a bounded cache; entries are cheap to reload
	}
	b.runCache[run] = cachedRun{rs: rs, seq: seq}
	b.mu.Unlock()
	return rs, seq, nil
}

// RunStartedSeq returns the stream sequence of the first run.started of a run: the only
// one that starts it.
func (b *Bus) RunStartedSeq(ctx context.Context, run string) (uint64, error) {
	_, seq, err := b.RunStartedAt(ctx, run)
	return seq, err
}

// firstRunStarted reads the first message on the run's run.started subject.
func (b *Bus) firstRunStarted(ctx context.Context, run string) (*toolbus.RunStarted, uint64, error) {
	raw, err := b.Stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(SubjectRunStarted(run)))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, 0, fmt.Errorf("%w: %s", ErrRunNotFound, run)
		}
		return nil, 0, fmt.Errorf("events: run.started of %s: %w", run, err)
	}
	rs := new(toolbus.RunStarted)
	if _, err := Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, rs); err != nil {
		return nil, 0, err
	}
	return rs, raw.Sequence, nil
}

// PutAssistant records the assistant message of a step. The first write wins: if the
// step already has one (a redelivered model.requested), the stored one is returned with
// created false, so a retried step never changes what the model said.
func (b *Bus) PutAssistant(ctx context.Context, mr toolbus.ModelResponded) (toolbus.ModelResponded, bool, error) {
	key := stepKey(mr.RunID, mr.Step, "a")
	if _, err := b.history.Create(ctx, key, mustJSON(mr)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return mr, false, fmt.Errorf("events: history %s: %w", key, err)
		}
		prev, err := b.Assistant(ctx, mr.RunID, mr.Step)
		return prev, false, err
	}
	return mr, true, nil
}

// Assistant returns the recorded assistant message of a step.
func (b *Bus) Assistant(ctx context.Context, run string, step int) (toolbus.ModelResponded, error) {
	var mr toolbus.ModelResponded
	err := b.getJSON(ctx, b.history, stepKey(run, step, "a"), &mr)
	return mr, err
}

func (b *Bus) getJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) error {
	e, err := kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return fmt.Errorf("events: get %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return fmt.Errorf("events: decode %s: %w", key, err)
	}
	return nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("events: marshal %T: %v", v, err)) // only plain data types reach here
	}
	return b
}
