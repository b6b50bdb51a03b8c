package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events/seal"
	"github.com/toolbus/toolbus/events/store"
)

// DefaultStream is the name of the event stream unless Config.Stream sets another.
// The defaults of Config, in one place. The envconfig default tags of Config repeat
// them (a tag must be a literal); TestConfigDefaultTags checks that they agree.
const (
	// DefaultStream is the name of the event stream.
	DefaultStream = "TOOLBUS"
	// DefaultMaxAge is how long events are kept for audit.
	DefaultMaxAge = 7 * 24 * time.Hour
	// DefaultDuplicates is the stream's duplicate window.
	DefaultDuplicates = 10 * time.Minute
	// DefaultReplicas is the replicas of the stream and buckets.
	DefaultReplicas = 1
	// DefaultInstanceTTL is how long an executor instance stays in the catalog after
	// its last heartbeat: the executors' lease, and so about how long a call whose
	// executor died waits before another executor takes it over (QueueAckWait).
	DefaultInstanceTTL = 5 * time.Second
	// DefaultOutputsMaxBytes bounds the bucket of large tool outputs (1 GiB).
	DefaultOutputsMaxBytes = 1 << 30
)

// Errors callers branch on: the store's, which the bus's own reads return too.
var (
	// ErrRunNotFound: no run.started event (or run state) for that run id.
	ErrRunNotFound = store.ErrRunNotFound
	// ErrRunEnded: the run already reached a terminal state; nothing may move it back.
	ErrRunEnded = store.ErrRunEnded
	// ErrConflict: a compare-and-set lost against a concurrent writer; reload and retry.
	ErrConflict = store.ErrConflict
	// ErrNotFound: the requested record does not exist (yet).
	ErrNotFound = store.ErrNotFound
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
	// heartbeat (default 5s); executors heartbeat every fifth of it. It is their lease:
	// a call whose executor died is handed to another within about one TTL.
	InstanceTTL time.Duration `envconfig:"INSTANCE_TTL" default:"5s"`
	// OutputsMaxBytes bounds the bucket of large tool outputs (default 1 GiB; -1
	// unbounded): when full, storing a new output fails instead of filling the disk.
	OutputsMaxBytes int64 `envconfig:"OUTPUTS_MAX_BYTES" default:"1073741824"`
	// StreamMaxBytes bounds the event stream (0: unbounded). Bounded, the stream
	// discards nothing (discard new: the audit trail is never cut short): a publish into
	// a full stream is refused (ErrStreamFull), and injectors refuse new runs
	// (quota_exceeded) once it holds StreamAdmitPercent of the bound, so the runs in
	// flight have the rest to finish in.
	StreamMaxBytes int64 `envconfig:"STREAM_MAX_BYTES"`
	// FairShare, set when `toolbus init` (or `toolbus up`) creates the queue stream,
	// stages every call for the core's fair scheduler (docs/fair-share.md) instead of
	// queueing it first come, first served. The injectors run the scheduler when the
	// queue stream stages calls, whatever their own setting.
	FairShare bool `envconfig:"FAIR_SHARE" desc:"toolbus init / up: stage the tools' calls for the injector's fair scheduler, which serves tenants sharing a tool by weighted round robin (docs/fair-share.md)"`
	// APIPrefix, set for an executor in a team account (the accounts layout of
	// deploy/nats/gen -accounts), is the subject prefix under which the team imports the
	// core account's JetStream API (JS.core.API). The bus then opens no stream or bucket
	// by name (their info is not exported), reaches its queues, keys and results only
	// through what the core exports to the team, and trusts tool.requested, which only
	// the core may publish there (see OpenTeam).
	APIPrefix string `envconfig:"NATS_API_PREFIX" desc:"executor in a team account (deploy/nats/gen -accounts): the prefix under which its account imports the core account's JetStream API (JS.core.API); the executor then reads no run and takes principal, allowlist, deadline and decisions from the call"`
	// ReadPrefix, set for a client in an account of its own (the accounts layout), is
	// the read service's API prefix of the identity it acts as (ReadAPIPrefix): the bus
	// then reads the stream and the buckets only through the core's read service, which
	// answers of the runs that identity may see.
	ReadPrefix string `envconfig:"NATS_READ_PREFIX" desc:"client in an account of its own (the accounts layout): the core read service's prefix of the identity it acts as (toolbus_read.<identity>.API); it then reads only the runs that identity may see"`
	// SigningKey is the file of the key every event this process publishes is signed
	// with (toolbus admin writes <user>.sign beside <user>.creds; sign.go).
	SigningKey string `envconfig:"SIGNING_KEY" desc:"signing key file (toolbus admin writes <user>.sign beside <user>.creds): every event published is signed with it (CONTRACT.md, Signed and chained events); empty: events are unsigned"`
}

// StreamAdmitPercent is how full (percent of Config.StreamMaxBytes) the event stream
// may be for a new run to start.
const StreamAdmitPercent = 90

// ErrStreamFull wraps a publish the event stream refused because it holds
// Config.StreamMaxBytes.
var ErrStreamFull = errors.New("events: the event stream is full")

// streamFull wraps err with ErrStreamFull when the stream refused a message for its
// byte bound.
func streamFull(stream string, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "maximum bytes exceeded") {
		return fmt.Errorf("%w: stream %s holds its TOOLBUS_STREAM_MAX_BYTES: raise the bound or shorten TOOLBUS_RETENTION (%w)", ErrStreamFull, stream, err)
	}
	return err
}

func (c *Config) setDefaults() {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.InstanceTTL <= 0 {
		c.InstanceTTL = DefaultInstanceTTL
	}
	if c.OutputsMaxBytes == 0 {
		c.OutputsMaxBytes = DefaultOutputsMaxBytes
	}
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// Bus is toolbus's view of JetStream: the connection, the event stream (publishing with
// deterministic ids, reading a run's events) and the shared state in the buckets it
// opened (Store: history, run states, approvals, catalog, claims, outputs). It is safe
// for concurrent use.
type Bus struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	reader jetstream.Stream
	// admin: this bus was opened by an administrator (OpenAdmin, provision.Setup) and
	// creates or updates the consumers its workers bind to; an opened one only binds.
	admin bool
	// state is the shared state in the buckets the bus opened.
	state *store.Store

	mu       sync.Mutex
	runCache map[string]cachedRun
	// perms records the permission violations the server reports to the connection.
	perms *connect.Permissions
	// team: opened in a team account (Config.APIPrefix, openTeam).
	team bool
	// msgKey keys the message ids of a team account's events (msgID).
	msgKey []byte
	// client: opened in a client account (Config.ReadPrefix, openClient).
	client bool
	// views are the buses of other identities on this client account's connection (As).
	views map[string]*Bus
	// signer signs every event this bus publishes (Config.SigningKey, SetSigner; nil:
	// unsigned).
	signer atomic.Pointer[seal.Signer]
}

// cachedRun is a run's first run.started, its stream sequence and its traceparent.
type cachedRun struct {
	rs          *toolbus.RunStarted
	seq         uint64
	traceparent string
}

// Open binds to the stream and the buckets that exist (provision.Setup, or `toolbus
// init`, made them): it looks them up and creates or updates nothing, so a worker with
// least-privilege credentials can open the bus. A missing one is an error wrapping
// ErrNotSetUp.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Bus, error) {
	cfg.setDefaults()
	if cfg.APIPrefix != "" {
		return withSigner(openTeam(nc, cfg))
	}
	if cfg.ReadPrefix != "" {
		return withSigner(openClient(ctx, nc, cfg, nil))
	}
	js, err := newJS(nc)
	if err != nil {
		return nil, err
	}
	return withSigner(open(ctx, nc, js, cfg))
}

// OpenAdmin is Open for an administrator's connection (provision.Setup opens its bus
// so): Admin reports true, and provision.Consumer creates or updates the consumers the
// bus's workers bind to, retrying while a cluster elects leaders.
func OpenAdmin(ctx context.Context, nc *nats.Conn, cfg Config) (*Bus, error) {
	b, err := Open(ctx, nc, cfg)
	if err != nil {
		return nil, err
	}
	b.admin = true
	return b, nil
}

// Admin reports whether the bus was opened by an administrator (OpenAdmin).
func (b *Bus) Admin() bool { return b.admin }

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
	b := &Bus{cfg: cfg, nc: nc, js: js, runCache: map[string]cachedRun{}, perms: connect.WatchPermissions(nc)}
	b.perms.SetHint(GrantHint)
	missing := func(what, name string, err error) error {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return &TenantRefusal{Err: err, Msg: "these credentials are a team's or a client's account, which holds no stream: a team's run `toolbus executor` with TOOLBUS_NATS_API_PREFIX=JS.core.API and read no run, a client's run, read and decide its identities' runs with TOOLBUS_NATS_READ_PREFIX=" + ReadServicePrefix + ".<identity>.API"}
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("%w: %s %s does not exist", ErrNotSetUp, what, name)
		}
		return fmt.Errorf("events: %s %s: %w", what, name, err)
	}
	var err error
	if b.stream, err = b.Stream(ctx, cfg.Stream); err != nil {
		return nil, missing("stream", cfg.Stream, err)
	}
	// Readers create their ephemeral consumers on the read mirror when there is one.
	b.reader = b.stream
	if m, err := b.Stream(ctx, ReadMirrorName(cfg.Stream)); err == nil {
		b.reader = m
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("events: stream %s: %w", ReadMirrorName(cfg.Stream), err)
	}
	var kvs store.Buckets
	for _, bk := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{
		{store.BucketHistory, &kvs.History}, {store.BucketRuns, &kvs.Runs}, {store.BucketTools, &kvs.Tools},
		{store.BucketApprovals, &kvs.Approvals}, {store.BucketClaims, &kvs.Claims}, {store.BucketInstances, &kvs.Instances},
		{store.BucketOutputs, &kvs.Outputs},
	} {
		if *bk.kv, err = js.KeyValue(ctx, bk.name); err != nil {
			return nil, missing("bucket", bk.name, err)
		}
	}
	// Batched reads of the history are direct gets, which any replica answers: they are
	// used only where that is the leader (one replica). Replicated buckets read key by
	// key from the leader (leaderReads).
	if hs, err := js.Stream(ctx, store.BucketStream(store.BucketHistory)); err == nil {
		if c := hs.CachedInfo().Config; c.Replicas <= 1 && c.AllowDirect {
			kvs.Conn = nc
		}
	}
	kvs.JS = js
	b.state = store.New(kvs, cfg.InstanceTTL)
	return b, nil
}

// Secrets returns the keys of team (""; store.NoTeam) in the secrets bucket
// (store.BucketSecrets), which only executors may read: opened on demand, since no
// other role needs it or may read it. In a team account it is reached through the keys
// the core exports to the team. A bucket `toolbus init` has not made yet is an error
// wrapping ErrNotSetUp.
func (b *Bus) Secrets(ctx context.Context, team string) (*store.Secrets, error) {
	api := "$JS.API"
	var kv jetstream.KeyValue
	if b.team {
		api = b.cfg.APIPrefix
		kv = store.NewDirectKV(b.js, b.nc, b.cfg.APIPrefix, store.BucketSecrets)
	} else {
		var err error
		kv, err = b.js.KeyValue(ctx, store.BucketSecrets)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("%w: bucket %s does not exist (run toolbus init)", ErrNotSetUp, store.BucketSecrets)
		}
		if err != nil {
			return nil, fmt.Errorf("events: bucket %s: %w", store.BucketSecrets, err)
		}
	}
	s := store.NewSecrets(kv, team)
	// Credentials without the secrets grant (a team's executor user of one account)
	// fail at once, and the executor renews its tokens alone.
	s.Guard = func(ctx context.Context) (context.Context, func(error) error) {
		return b.Guard(ctx, api+".DIRECT.GET.KV_"+store.BucketSecrets, api+".STREAM.MSG.GET.KV_"+store.BucketSecrets,
			store.KeyPrefix(store.BucketSecrets))
	}
	return s, nil
}

// Store is the shared state in the buckets the bus opened: history, run states,
// approvals, the tool catalog, claims, instances and large outputs.
func (b *Bus) Store() *store.Store { return b.state }

// Conn is the bus's NATS connection, for core NATS subscriptions (run.cancel and run
// outcomes, which workers follow without a consumer) and connection health.
func (b *Bus) Conn() *nats.Conn { return b.nc }

// JetStream is the JetStream context of the bus's connection, for what the Bus does not
// wrap (raw publishes of conformance and fault tests, bucket handles).
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// EventStream is the event stream the bus publishes to, for its durable consumers
// (package events/provision binds them, readers inspect them) and stream state.
func (b *Bus) EventStream() jetstream.Stream { return b.stream }

// Reader is the stream readers create their ephemeral (ordered) consumers on: the read
// mirror when `toolbus init` made one (least-privilege roles may create consumers only
// there, where no worker's durable lives), else the event stream itself.
func (b *Bus) Reader() jetstream.Stream { return b.reader }

// Config returns the configuration the bus was opened with (defaults applied).
func (b *Bus) Config() Config { return b.cfg }

// Publish encodes and publishes one event and waits for the stream's acknowledgement. A
// duplicate (the same event, same subject, type and id, inside the duplicate window) is
// acknowledged and not stored again; a message of another subject or type that took the
// event's id does not suppress it (see publishMsg).
func (b *Bus) Publish(ctx context.Context, subject string, m Meta, data any) (*jetstream.PubAck, error) {
	msg, err := b.encode(ctx, subject, m, data)
	if err != nil {
		return nil, err
	}
	return b.publishMsg(ctx, msg, m.ID)
}

// Source returns the CloudEvents source of a component instance.
func Source(component, instance string) string { return "/toolbus/" + component + "/" + instance }

// Denied turns err, an operation's error, into a *connect.PermissionError when the
// server refused an operation of this bus's connection since start (the operation's
// start): a refused request is only dropped by the server, so err is a timeout that
// says nothing. It returns err unchanged otherwise (nil for nil).
func (b *Bus) Denied(start time.Time, err error) error { return b.perms.Denied(start, err) }

// Guard returns a context for one operation on subjects starting with one of prefixes
// that ends as soon as the server refuses one of them to this bus's credentials, and
// done, which turns the operation's error into the *connect.PermissionError naming the
// credentials, the subject and the missing grant (GrantHint): a refusal explains itself
// at once instead of ending as a timeout.
func (b *Bus) Guard(ctx context.Context, prefixes ...string) (context.Context, func(error) error) {
	return b.perms.Guard(ctx, prefixes...)
}

// Denial returns the last permission violation of this bus's connection and when it
// happened, while it is more recent than connect.DenialHold: a role whose credentials
// miss a permission it uses is not ready.
func (b *Bus) Denial() (*connect.PermissionError, time.Time, bool) { return b.perms.Denial() }

// OnDenied calls f (which must not block) for each permission violation the server
// reports to this bus's connection from now on: a metric, a log line.
func (b *Bus) OnDenied(f func(*connect.PermissionError)) { b.perms.OnDenied(f) }
