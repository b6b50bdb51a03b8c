// Package provision creates what the bus needs, as an administrator: the event stream,
// its read mirror, the buckets of the shared state and the durable consumers of the
// workers, with their limits. Setup is idempotent (`toolbus init`, `toolbus up`, tests);
// Consumer binds a worker to its durable, creating or updating it where the credentials
// allow.
package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/internal/retry"
)

// Roles of the worker consumers.
const (
	RolePlanner  = "planner"
	RoleInjector = "injector"
	RoleExecutor = "executor"
)

// ConsumerConfig configures a durable pull consumer shared by every process of a role.
type ConsumerConfig struct {
	// Durable name; every process with the same name shares the work, no duplicates.
	Durable string
	// Filters are the subjects the consumer takes.
	Filters []string
	// AckWait before an unacknowledged message is redelivered (default 30s). Long work
	// sends InProgress heartbeats.
	AckWait time.Duration
	// MaxDeliver bounds deliveries (default 10; -1 unlimited).
	MaxDeliver int
	// BackOff between redeliveries after a Nak without delay.
	BackOff []time.Duration
	// MaxAckPending bounds messages in flight across all processes (default 1000).
	MaxAckPending int
	// DeliverNew starts a consumer created on a stream with history at the next message
	// instead of the first; an existing durable keeps its position either way.
	DeliverNew bool
	// Queue: the consumer is a tool's queue, on the queue stream (events.QueueStreamName)
	// instead of the event stream.
	Queue bool
}

// WorkerSettings are the knobs of a role's consumers; zero values take the defaults.
// `toolbus init` and the workers derive them from the same TOOLBUS_* settings, so the
// consumers an administrator creates are the ones the workers expect.
type WorkerSettings struct {
	// Durable replaces the base name of the role's consumers (suffixes are kept).
	Durable string
	// AckWait of the role's consumers (default 30s).
	AckWait time.Duration
	// MaxDeliver of the role's consumers (default 5 for the planner, 10 for the
	// injector's inputs; its timers are redelivered forever).
	MaxDeliver int
	// MaxTimers bounds the injector's deadline timers held at once (default 100000).
	MaxTimers int
	// Concurrency is the messages one process handles at once (default 64).
	Concurrency int
}

// WorkerConsumer is one durable consumer of a worker role and how many of its messages
// one process handles at once.
type WorkerConsumer struct {
	Role string
	ConsumerConfig
	Concurrency int
	// Timers marks the injector's consumer of deadline timers (served apart).
	Timers bool
}

// WorkerConsumers returns the durable consumers of a role (RolePlanner or RoleInjector;
// nil for others). It is the one list Setup creates and the workers bind to: a new
// consumer of the planner or the injector is added here.
//
// The injector has a consumer per input with a single filter subject: the server serves
// a single-filter consumer from its subject index, while a multi-filter consumer
// intersects every subject of the stream on each fetch.
func WorkerConsumers(role string, s WorkerSettings) []WorkerConsumer {
	if s.AckWait <= 0 {
		s.AckWait = 30 * time.Second
	}
	if s.Concurrency <= 0 {
		s.Concurrency = 64
	}
	switch role {
	case RolePlanner:
		if s.Durable == "" {
			s.Durable = events.ConsumerPlanner
		}
		if s.MaxDeliver == 0 {
			s.MaxDeliver = 5
		}
		return []WorkerConsumer{{Role: role, Concurrency: s.Concurrency, ConsumerConfig: ConsumerConfig{
			Durable: s.Durable, Filters: []string{events.FilterModelRequested},
			AckWait: s.AckWait, MaxDeliver: s.MaxDeliver, MaxAckPending: s.Concurrency * 4,
		}}}
	case RoleInjector:
		if s.Durable == "" {
			s.Durable = events.ConsumerInjector
		}
		if s.MaxDeliver == 0 {
			s.MaxDeliver = 10
		}
		if s.MaxTimers <= 0 {
			s.MaxTimers = 100000
		}
		inputs := []struct {
			name, filter string
			concurrency  int
		}{
			{s.Durable, events.FilterToolFinished, s.Concurrency},
			{s.Durable + "-waiting", events.FilterToolWaiting, 8},
			{s.Durable + "-approvals", events.FilterApprovals, 8},
			{s.Durable + "-cancel", events.FilterRunCancel, 8},
			// run.started comes in bursts and is light to handle: pulls of 32 cost a
			// quarter of the pull requests of 8 (0.2 -> 0.06 per run)
			{s.Durable + "-started", events.FilterRunStarted, 32},
		}
		out := make([]WorkerConsumer, 0, len(inputs)+1)
		for _, in := range inputs {
			pending := in.concurrency * 8
			if in.filter == events.FilterRunStarted {
				// The injector keeps a young run's run.started instead of publishing its
				// deadline timer at once (up to an eighth of this each), like the timers.
				pending = max(pending, s.MaxTimers)
			}
			out = append(out, WorkerConsumer{Role: role, Concurrency: in.concurrency, ConsumerConfig: ConsumerConfig{
				Durable: in.name, Filters: []string{in.filter},
				AckWait: s.AckWait, MaxDeliver: s.MaxDeliver, MaxAckPending: pending,
			}})
		}
		// The deadline timers: each is held (a delayed negative acknowledgement) until its
		// run's deadline, so their number in flight is bounded by MaxTimers, not by a
		// handler's concurrency, and they are redelivered forever.
		out = append(out, WorkerConsumer{Role: role, Timers: true, ConsumerConfig: ConsumerConfig{
			Durable: s.Durable + "-timers", Filters: []string{events.FilterTimers},
			AckWait: s.AckWait, MaxDeliver: -1, MaxAckPending: s.MaxTimers,
		}})
		return out
	}
	return nil
}

// Option adds to what Setup creates.
type Option func(*setupOptions)

type setupOptions struct {
	tools      []string
	toolCfg    func(tool string, instanceTTL time.Duration) ConsumerConfig
	workers    map[string]WorkerSettings
	readMirror bool
}

// WithTools also creates the queue consumer of each tool (ToolConsumerConfig) and the
// one of calls for unknown tools, so executors with least-privilege credentials only
// bind to them. ackWait and maxAckPending are the executors' settings (the queues'
// AckWait is workerconfig.QueueAckWait of ackWait and the setup's instance TTL).
func WithTools(tools []string, ackWait time.Duration, maxAckPending int) Option {
	return func(o *setupOptions) {
		o.tools = append(o.tools, tools...)
		o.toolCfg = func(tool string, instanceTTL time.Duration) ConsumerConfig {
			return ToolConsumerConfig(tool, workerconfig.QueueAckWait(ackWait, instanceTTL), maxAckPending)
		}
	}
}

// WithWorkers sets the settings of a role's consumers (default WorkerSettings{}).
func WithWorkers(role string, s WorkerSettings) Option {
	return func(o *setupOptions) { o.workers[role] = s }
}

// WithReadMirror also creates the read mirror of the stream (events.ReadMirrorName): readers
// without the right to create consumers on the event stream (tail, replay, `toolbus
// run`) create their ephemeral consumers there, where no worker's durable lives.
func WithReadMirror() Option {
	return func(o *setupOptions) { o.readMirror = true }
}

// Change is one thing Setup created, updated or found as wanted.
type Change struct {
	// Kind is stream, bucket or consumer.
	Kind string
	Name string
	// Action is created, updated or unchanged.
	Action string
}

func (c Change) String() string { return c.Action + " " + c.Kind + " " + c.Name }

// Setup (admin) creates or updates the stream (which denies message deletes and
// purges), every bucket and the durable consumers of the planner and
// injector (WorkerConsumers), plus what opts add; it is idempotent. It returns the bus,
// which may also create or update the consumers its workers bind to, and the changes.
//
// The embedded server's single user is admin: `toolbus up` and tests call Setup; a
// deployment with per-role credentials runs `toolbus init` once and its workers Open.
func Setup(ctx context.Context, nc *nats.Conn, cfg events.Config, opts ...Option) (_ *events.Bus, _ []Change, err error) {
	// Credentials that are not the admin's are refused the first create: say so at
	// once, naming them and the grant, rather than after the request's timeout.
	perms := connect.WatchPermissions(nc)
	perms.SetHint(events.GrantHint)
	ctx, done := perms.Guard(ctx, "$JS.API.")
	defer func() { err = done(err) }()
	cfg = cfg.WithDefaults()
	o := &setupOptions{workers: map[string]WorkerSettings{}}
	for _, opt := range opts {
		opt(o)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("provision: jetstream: %w", err)
	}
	var changes changeLog
	// A read mirror made by an earlier `toolbus init` counts as wanted: it must be
	// updated with the stream, whose direct gets it would otherwise answer too
	// (eventStreamConfig).
	mirrored := o.readMirror
	if !mirrored {
		switch _, err := js.Stream(ctx, events.ReadMirrorName(cfg.Stream)); {
		case err == nil:
			mirrored = true
		case !errors.Is(err, jetstream.ErrStreamNotFound):
			return nil, nil, fmt.Errorf("provision: stream %s: %w", events.ReadMirrorName(cfg.Stream), err)
		}
	}
	if err := upsertStream(ctx, js, eventStreamConfig(cfg, mirrored), changes.note); err != nil {
		return nil, nil, err
	}
	if mirrored {
		if err := upsertStream(ctx, js, readMirrorConfig(cfg), changes.note); err != nil {
			return nil, nil, err
		}
	}
	if err := setupQueueStream(ctx, js, cfg, changes.note); err != nil {
		return nil, nil, err
	}
	for _, bk := range buckets {
		if err := setupBucket(ctx, js, cfg, bk.name, bk.desc, changes.note); err != nil {
			return nil, nil, err
		}
	}
	b, err := events.OpenAdmin(ctx, nc, cfg)
	if err != nil {
		return nil, nil, err
	}
	for _, cc := range o.consumers(cfg.InstanceTTL) {
		_, existed, changed, err := ensureConsumer(ctx, b, cc)
		if err != nil {
			return nil, nil, err
		}
		changes.add("consumer", cc.Durable, existed, changed)
	}
	return b, changes, nil
}

// changeLog collects the changes of Setup.
type changeLog []Change

// note records what was done to a stream or bucket: created, or updated if its config
// before differs from after.
func (l *changeLog) note(kind, name string, existed bool, before, after any) {
	l.add(kind, name, existed, existed && !jsonEqual(before, after))
}

func (l *changeLog) add(kind, name string, existed, changed bool) {
	a := "created"
	if existed {
		a = map[bool]string{true: "updated", false: "unchanged"}[changed]
	}
	*l = append(*l, Change{Kind: kind, Name: name, Action: a})
}

// eventStreamConfig is the configuration of the event stream.
func eventStreamConfig(cfg events.Config, mirrored bool) jetstream.StreamConfig {
	sc := jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "toolbus events (CONTRACT.md)",
		Subjects:    []string{events.FilterAll},
		Duplicates:  cfg.Duplicates,
		// Direct gets are answered by any replica, and a follower behind the leader
		// answers with stale data (a run.started not there yet); replicated streams are
		// read through their leader. So is a mirrored one: the server makes a mirror of
		// a stream that allows direct gets answer that stream's direct gets too, in the
		// same queue group, from wherever its copy has got to (a publish acknowledged
		// and then not found by its sequence). Its own direct gets stay on.
		AllowDirect: cfg.Replicas <= 1 && !mirrored,
		// Only an administrator creates consumers here (one durable per worker queue
		// and per tool): an explicit limit above the server's default of 1,000.
		MaxConsumers: EventStreamMaxConsumers,
	}
	// The events are the audit trail: no message delete, no purge, by anyone but an
	// administrator who first updates this setting (eventLimits).
	eventLimits(&sc, cfg)
	byteBound(&sc, cfg)
	return sc
}

// readMirrorConfig is the configuration of the read mirror (WithReadMirror).
func readMirrorConfig(cfg events.Config) jetstream.StreamConfig {
	mc := jetstream.StreamConfig{
		Name:        events.ReadMirrorName(cfg.Stream),
		Description: "read mirror of " + cfg.Stream + ": readers' ephemeral consumers live here",
		Mirror:      &jetstream.StreamSource{Name: cfg.Stream},
		AllowDirect: cfg.Replicas <= 1,
	}
	eventLimits(&mc, cfg)
	readerLimits(&mc)
	return mc
}

// setupBucket creates or updates a bucket and notes what it did.
func setupBucket(ctx context.Context, js jetstream.JetStream, cfg events.Config, name, desc string, note func(kind, name string, existed bool, before, after any)) error {
	kc := jetstream.KeyValueConfig{
		Bucket: name, Description: desc, History: 1, TTL: kvTTL(name, cfg),
		Storage: storage(cfg), Replicas: cfg.Replicas, MaxValueSize: -1,
	}
	if name == store.BucketOutputs {
		kc.MaxBytes = cfg.OutputsMaxBytes
	}
	if name == store.BucketSecrets {
		kc.MaxBytes, kc.MaxValueSize = SecretsMaxBytes, SecretsMaxValueSize
	}
	if name == store.BucketInstances {
		// An expired instance leaves a delete marker, so catalog watchers see it go.
		kc.LimitMarkerTTL = max(cfg.InstanceTTL, time.Second)
	}
	var before any
	s, err := js.Stream(ctx, store.BucketStream(name))
	existed := err == nil
	if existed {
		before = s.CachedInfo().Config
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
		return fmt.Errorf("provision: bucket %s: %w", name, err)
	}
	// The secrets keep their direct gets replicated: a team reads its own keys by the
	// direct gets the core exports to it, and no core role reads them for it (the read
	// service's credentials may not: the injector would hold every team's tokens). A
	// follower behind the leader may answer an older record; every renewal first takes
	// the record's lease by compare-and-set, which the leader checks (mcpauth), so a
	// stale read costs a retry, never a refresh with a token already used.
	if cfg.Replicas > 1 && name != store.BucketSecrets {
		if _, err := leaderReads(ctx, js, name); err != nil {
			return err
		}
	}
	if err := limitReaders(ctx, js, store.BucketStream(name)); err != nil {
		return err
	}
	after, err := js.Stream(ctx, store.BucketStream(name))
	if err != nil {
		return fmt.Errorf("provision: bucket %s: %w", name, err)
	}
	note("bucket", name, existed, before, after.CachedInfo().Config)
	return nil
}

// consumers are the durable consumers Setup creates: the planner's and the injector's,
// and with WithTools each tool's queue and the unknown-tool queue.
func (o *setupOptions) consumers(instanceTTL time.Duration) []ConsumerConfig {
	var ccs []ConsumerConfig
	for _, role := range []string{RolePlanner, RoleInjector} {
		for _, wc := range WorkerConsumers(role, o.workers[role]) {
			ccs = append(ccs, wc.ConsumerConfig)
		}
	}
	if o.toolCfg != nil {
		seen := map[string]bool{}
		// No queue for events.UnknownToolToken: the planner answers the calls of tools nobody
		// serves itself, so nobody consumes tool.requested._unknown.
		for _, t := range o.tools {
			if tok := events.ToolToken(t); tok != events.UnknownToolToken && !seen[tok] {
				seen[tok] = true
				ccs = append(ccs, o.toolCfg(tok, instanceTTL))
			}
		}
	}
	return ccs
}

var buckets = []struct{ name, desc string }{
	{store.BucketHistory, "run history: assistant messages and joined step results"},
	{store.BucketRuns, "run state"},
	{store.BucketTools, "tool catalog published by executors"},
	{store.BucketApprovals, "approval decisions per call"},
	{store.BucketClaims, "executions claimed by executors, one key per call"},
	{store.BucketInstances, "live executor instances (heartbeats)"},
	{store.BucketOutputs, "whole tool outputs too large for an event, in chunks, one key prefix per tool"},
	{store.BucketSecrets, "secrets a team's executors share (OAuth tokens of MCP servers), one key prefix per team"},
	{seal.BucketCheckpoints, "signed checkpoints of the event stream (audit/checkpoint), the latest under key latest, and its tree's tiles (tile/8/...), never expiring"},
}

// Bounds of the secrets bucket: a few tokens per team and server, never a store of
// large values.
const (
	SecretsMaxBytes     = 64 << 20
	SecretsMaxValueSize = 64 << 10
)

// Consumer limits `toolbus init` sets. Readers (tail, replay, runs, tools, toolbus run,
// toolbus mcp, the console, the planner's catalog) create no consumer: they read with
// direct gets. The limits bound what a role that may still create consumers somewhere
// (or an administrator's tool) can leave behind: a stream where readers might create
// consumers holds at most ReaderMaxConsumers, and any consumer created there, durable
// or not, is deleted ReaderConsumerInactive after its last use (the server refuses a
// longer inactive threshold).
const (
	EventStreamMaxConsumers = 10000
	ReaderMaxConsumers      = 1000
	ReaderConsumerInactive  = 5 * time.Minute // nats.go's ordered consumers ask for 5 minutes
)

func readerLimits(sc *jetstream.StreamConfig) {
	sc.MaxConsumers = ReaderMaxConsumers
	sc.ConsumerLimits = jetstream.StreamConsumerLimits{InactiveThreshold: ReaderConsumerInactive}
}

// limitReaders sets the reader limits on the stream of a bucket (the KV and object
// store APIs do not expose them).
func limitReaders(ctx context.Context, js jetstream.JetStream, name string) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("provision: stream %s: %w", name, err)
	}
	c := s.CachedInfo().Config
	if c.MaxConsumers == ReaderMaxConsumers && c.ConsumerLimits.InactiveThreshold == ReaderConsumerInactive {
		return nil
	}
	readerLimits(&c)
	if _, err := js.UpdateStream(ctx, c); err != nil {
		return fmt.Errorf("provision: stream %s: consumer limits: %w", name, err)
	}
	return nil
}

// storage is the storage of the stream and buckets cfg describes.
func storage(cfg events.Config) jetstream.StorageType {
	if cfg.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

func upsertStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig, note func(kind, name string, existed bool, before, after any)) error {
	var before any
	s, err := js.Stream(ctx, sc.Name)
	existed := err == nil
	if existed {
		before = s.CachedInfo().Config
	}
	s, err = js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return fmt.Errorf("provision: stream %s: %w", sc.Name, err)
	}
	note("stream", sc.Name, existed, before, s.CachedInfo().Config)
	return nil
}

// jetstream is the JetStream configuration of cc, defaults applied.
func (cc ConsumerConfig) jetstream() jetstream.ConsumerConfig {
	if cc.AckWait == 0 {
		cc.AckWait = 30 * time.Second
	}
	if cc.MaxDeliver == 0 {
		cc.MaxDeliver = 10
	}
	if cc.MaxAckPending == 0 {
		cc.MaxAckPending = 1000
	}
	cfg := jetstream.ConsumerConfig{
		Durable:       cc.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cc.AckWait,
		MaxDeliver:    cc.MaxDeliver,
		BackOff:       cc.BackOff,
		MaxAckPending: cc.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if cc.DeliverNew {
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	if len(cc.Filters) == 1 {
		cfg.FilterSubject = cc.Filters[0]
	} else {
		cfg.FilterSubjects = cc.Filters
	}
	return cfg
}

// sameConsumer reports whether an existing consumer has what want sets.
func sameConsumer(have, want jetstream.ConsumerConfig) bool {
	hf := append([]string{have.FilterSubject}, have.FilterSubjects...)
	wf := append([]string{want.FilterSubject}, want.FilterSubjects...)
	return slices.Equal(hf, wf) && have.AckWait == want.AckWait && have.MaxDeliver == want.MaxDeliver &&
		have.MaxAckPending == want.MaxAckPending && slices.Equal(have.BackOff, want.BackOff) &&
		have.DeliverPolicy == want.DeliverPolicy && have.AckPolicy == want.AckPolicy
}

// Consumer binds to a durable pull consumer on the toolbus stream of b. A bus from Setup
// (events.OpenAdmin) creates it, or updates it to cc, as needed. A bus from events.Open
// binds to the existing one; when it is missing or differs from cc it tries once to
// create or update it (which a role's credentials usually forbid) and otherwise uses the
// consumer as the administrator configured it; a missing one is then an error wrapping
// events.ErrNotSetUp.
func Consumer(ctx context.Context, b *events.Bus, cc ConsumerConfig) (jetstream.Consumer, error) {
	cons, _, _, err := ensureConsumer(ctx, b, cc)
	return cons, err
}

// ToolConsumerConfig is the consumer of one tool's queue. Created on a stream that
// already holds calls, it starts with the calls published after it (DeliverNew): a
// queue never re-runs history. Deliveries are unlimited: a call handed back because its
// run is at its cap is not a failure, and executors bound the executions of a call
// through its claim instead.
func ToolConsumerConfig(tool string, ackWait time.Duration, maxAckPending int) ConsumerConfig {
	return ConsumerConfig{
		Durable: events.ToolConsumer(tool), Filters: []string{events.SubjectQueue(tool)},
		AckWait: ackWait, MaxDeliver: -1, MaxAckPending: maxAckPending, DeliverNew: true, Queue: true,
	}
}

// ensureConsumer binds to cc's durable, creating or updating it when the bus may (see
// Consumer). It reports whether the consumer existed and whether it was changed.
func ensureConsumer(ctx context.Context, b *events.Bus, cc ConsumerConfig) (cons jetstream.Consumer, existed, changed bool, err error) {
	want := cc.jetstream()
	stream := b.EventStream()
	if cc.Queue {
		stream = b.QueueStream()
	}
	have, err := stream.Consumer(ctx, cc.Durable)
	switch {
	case err == nil:
		existed = true
		if sameConsumer(have.CachedInfo().Config, want) {
			return have, true, false, nil
		}
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, false, false, fmt.Errorf("provision: consumer %s: %w", cc.Durable, err)
	}
	if !b.Admin() {
		// One attempt, bounded: a role without the right gets no answer at all (the
		// server drops the request as a permissions violation).
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cons, err := stream.CreateOrUpdateConsumer(actx, want)
		cancel()
		switch {
		case err == nil:
			return cons, existed, true, nil
		case existed:
			slog.Default().Warn("consumer differs from this worker's settings and may not be updated with these credentials; using it as set up",
				"consumer", cc.Durable, "error", err)
			return have, true, false, nil
		default:
			return nil, false, false, fmt.Errorf("%w: consumer %s does not exist and could not be created: %w", events.ErrNotSetUp, cc.Durable, err)
		}
	}
	// A replicated consumer can take seconds to create while a cluster elects leaders:
	// timeouts and server-side unavailability are retried for about 30s (11 attempts,
	// 250ms doubling to 4s between them).
	err = retry.Do(ctx, retry.Policy{Attempts: 11, Base: 250 * time.Millisecond, Max: 4 * time.Second,
		OnError: func(_ int, err error, wait time.Duration) (time.Duration, error) {
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && apiErr.Code < 500 {
				return 0, err // refused, not unavailable: asking again gets the same answer
			}
			return wait, nil
		}}, func(ctx context.Context) error {
		var err error
		cons, err = stream.CreateOrUpdateConsumer(ctx, want)
		return err
	})
	if err != nil {
		return nil, existed, false, fmt.Errorf("provision: consumer %s: %w", cc.Durable, err)
	}
	return cons, existed, true, nil
}

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
	name := store.BucketStream(bucket)
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
			return nil, fmt.Errorf("provision: bucket %s: leader reads: %w", bucket, err)
		}
		k, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return nil, fmt.Errorf("provision: bucket %s: %w", bucket, err)
		}
		if off, err := directOff(); err == nil && off {
			return k, nil
		}
	}
	return nil, fmt.Errorf("provision: bucket %s: direct gets keep being turned on", bucket)
}

func kvTTL(name string, cfg events.Config) time.Duration {
	switch name {
	case store.BucketTools, store.BucketSecrets:
		// A token kept for an idle server must not age out: its refresh token may be
		// the only one left of an operator's login.
		return 0
	case seal.BucketCheckpoints:
		// The checkpoints and the tree's tiles outlive the events they cover: the
		// tiles are what proves the retained events once older ones expired.
		return 0
	case store.BucketInstances:
		return cfg.InstanceTTL
	}
	return cfg.MaxAge
}
