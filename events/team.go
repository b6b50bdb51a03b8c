package events

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events/store"
)

// ErrTeamAccount wraps what a bus opened in a team account (Config.APIPrefix) cannot do:
// read runs, streams or buckets beyond the keys the core account exports to the team.
var ErrTeamAccount = errors.New("events: not available in a team account")

// openTeam opens the bus of an executor in a team account. The team sees the core
// account's JetStream only through its imports, under cfg.APIPrefix: the durable queues
// of its tools (pulls and acknowledgements: no info, teamqueue.go), the result, wait, progress, log
// and question subjects of its tools, its tools' claims, outputs and catalog keys, its
// instance records, and the last result of a tool in a run. Nothing is looked up by
// name: a stream's or bucket's info would list every subject or key in it, so the core
// does not export it.
func openTeam(nc *nats.Conn, cfg Config) (*Bus, error) {
	js, err := jetstream.NewWithAPIPrefix(nc, cfg.APIPrefix, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("events: jetstream under %s: %w", cfg.APIPrefix, err)
	}
	b := &Bus{cfg: cfg, nc: nc, js: js, runCache: map[string]cachedRun{}, perms: connect.WatchPermissions(nc), team: true,
		msgKey: teamMsgKey(nc)}
	b.perms.SetHint(GrantHint)
	b.stream = &teamStream{js: js, nc: nc, name: cfg.Stream, prefix: cfg.APIPrefix}
	b.reader = b.stream
	kv := func(bucket string) jetstream.KeyValue {
		return store.NewTeamKV(js, nc, cfg.APIPrefix, TeamReadLocal(store.BucketStream(bucket), store.KeyPrefix(bucket)), bucket)
	}
	b.state = store.New(store.Buckets{
		History: kv(store.BucketHistory), Runs: kv(store.BucketRuns), Tools: kv(store.BucketTools),
		Approvals: kv(store.BucketApprovals), Claims: kv(store.BucketClaims), Instances: kv(store.BucketInstances),
		Outputs: kv(store.BucketOutputs), JS: js,
	}, cfg.InstanceTTL)
	return b, nil
}

// TeamAccount reports whether the bus was opened in a team account (Config.APIPrefix):
// its tool.requested events come from the core account only, so an executor trusts what
// a call says of its run (principal, allowlist, deadline, decision) instead of reading
// the run, which it may not.
func (b *Bus) TeamAccount() bool { return b.team }

// teamStream is the event stream as a team account reaches it: durable consumers bound
// by name and the last message of a subject (direct get in its subject form, which the
// core exports for its tools' result subjects only). It creates no consumer and reads
// no info; the jetstream.Stream methods it does not override are not available (they
// are not called on a team bus).
type teamStream struct {
	jetstream.Stream
	js     jetstream.JetStream
	nc     *nats.Conn
	name   string
	prefix string
}

func (s *teamStream) CachedInfo() *jetstream.StreamInfo {
	return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: s.name}}
}

func (s *teamStream) Info(context.Context, ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	return nil, fmt.Errorf("%w: info of stream %s", ErrTeamAccount, s.name)
}

func (s *teamStream) Consumer(ctx context.Context, name string) (jetstream.Consumer, error) {
	return s.js.Consumer(ctx, s.name, name)
}

func (s *teamStream) CreateOrUpdateConsumer(_ context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	return nil, fmt.Errorf("%w: consumer %s is made by `toolbus init` in the core account", ErrTeamAccount, cfg.Durable)
}

func (s *teamStream) CreateConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	return s.CreateOrUpdateConsumer(ctx, cfg)
}

func (s *teamStream) OrderedConsumer(context.Context, jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	return nil, fmt.Errorf("%w: reading stream %s", ErrTeamAccount, s.name)
}

func (s *teamStream) GetMsg(_ context.Context, seq uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return nil, fmt.Errorf("%w: message %d of stream %s", ErrTeamAccount, seq, s.name)
}

// GetLastMsgForSubject reads the last message on subject with a direct get in its
// subject form (<prefix>.DIRECT.GET.<stream>.<subject>). With a read mirror (what
// `toolbus init` sets up) the stream serves no direct gets and its mirror does: nothing
// answering the first, it asks the mirror (the core exports the last result of the
// team's tools there too), so that a take-over finds a result stored before it instead
// of going by the claim's done mark alone. The mirror copies within moments, and a
// take-over comes an instance TTL after the result. Replicated, neither serves them, and
// the core's read service answers from the stream's leader (TeamReadLocal).
func (s *teamStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	m, err := store.DirectGet(ctx, s.nc, s.prefix+".DIRECT.GET."+s.name+"."+subject)
	if errors.Is(err, nats.ErrNoResponders) {
		m, err = store.DirectGet(ctx, s.nc, s.prefix+".DIRECT.GET."+ReadMirrorName(s.name)+"."+subject)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		m, err = store.DirectGet(ctx, s.nc, TeamReadLocal(s.name, subject))
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("events: %w", err)
	}
	return m, err
}

// msgID is the Nats-Msg-Id an event of id is published with. The stream's duplicate
// window is keyed by Nats-Msg-Id across all of its subjects, and an event's id is
// deterministic, so another team could publish on its own subject first under the id of
// this team's result, and the stream would drop the real one as a duplicate (a team may
// not read the stream to notice). In a team account the message id is therefore
// <id>/guarded/<HMAC of id>, keyed by the team's credentials: the same for every
// instance of the team (a re-publish after a crash is still a duplicate) and unknown to
// anyone else. Consumers identify an event by its id, never by Nats-Msg-Id (CONTRACT.md).
func (b *Bus) msgID(id string) string {
	if !b.team || b.msgKey == nil {
		return id
	}
	m := hmac.New(sha256.New, b.msgKey)
	m.Write([]byte(id))
	return id + GuardedIDSeparator + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// teamMsgKey derives the key of msgID from the secret of the connection's credentials:
// an ed25519 signature (deterministic) of a fixed text by the user's nkey (a .creds file
// or an nkey seed), else its password, else its token. Without any (a team on mutual TLS
// alone) the ids stay plain.
func teamMsgKey(nc *nats.Conn) []byte {
	var material []byte
	switch o := nc.Opts; {
	case o.SignatureCB != nil:
		sig, err := o.SignatureCB([]byte("toolbus message ids v1"))
		if err != nil {
			return nil
		}
		material = sig
	case o.Password != "":
		material = []byte(o.User + "\x00" + o.Password)
	case o.Token != "":
		material = []byte(o.Token)
	default:
		return nil
	}
	k := sha256.Sum256(append([]byte("toolbus-msgid-v1\x00"), material...))
	return k[:]
}
