package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/internal/refusal"
)

// NewDirectKV returns a bucket handle for a process in a team account, which reaches
// the core account's buckets only through the keys exported to it: reads are direct
// gets in their subject form (<apiPrefix>.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>,
// which an export can scope to a key prefix), writes are publishes on $KV.<bucket>.<key>
// answered by the stream. Unlike jetstream.KeyValue it needs no stream info, which an
// export cannot scope (its subjects filter lists every key of the bucket).
//
// It offers Get, Put, Create, Update and Delete, what an executor does with its
// claims, instance record, catalog entries and outputs; every other method of
// jetstream.KeyValue returns ErrDirectOnly.
func NewDirectKV(js jetstream.JetStream, nc *nats.Conn, apiPrefix, bucket string) jetstream.KeyValue {
	if apiPrefix == "" {
		apiPrefix = "$JS.API"
	}
	return &directKV{js: js, nc: nc, bucket: bucket, get: apiPrefix + ".DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "."}
}

// NewTeamKV is NewDirectKV for an executor in a team account, with the subject prefix
// of the core's read service for the bucket's keys (events.TeamReadLocal of the
// bucket's stream and "$KV.<bucket>."): a replicated bucket serves no direct gets
// (nothing answers them), and the read service answers the same get from the leader.
// The handle asks where the last answer came from first.
func NewTeamKV(js jetstream.JetStream, nc *nats.Conn, apiPrefix, leader, bucket string) jetstream.KeyValue {
	kv := NewDirectKV(js, nc, apiPrefix, bucket).(*directKV)
	kv.leader = leader
	return kv
}

// ErrDirectOnly is returned by the methods a NewDirectKV handle does not offer.
var ErrDirectOnly = errors.New("store: not available through exported keys (team account)")

type directKV struct {
	unsupportedKV
	js     jetstream.JetStream
	nc     *nats.Conn
	bucket string
	get    string
	// leader is NewTeamKV's read service prefix ("" for none); viaLeader is set while
	// the direct gets go unanswered.
	leader    string
	viaLeader atomic.Bool
}

func (kv *directKV) Bucket() string { return kv.bucket }

func (kv *directKV) subject(key string) string { return KeySubject(kv.bucket, key) }

func (kv *directKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := kv.last(ctx, key)
	if err != nil {
		return nil, err
	}
	if e.op != jetstream.KeyValuePut {
		return nil, jetstream.ErrKeyNotFound
	}
	return e, nil
}

// last reads the last message of key, delete and purge markers included.
func (kv *directKV) last(ctx context.Context, key string) (*directEntry, error) {
	m, err := kv.getLast(ctx, key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: %s of %s: %w", key, kv.bucket, err)
	}
	e := &directEntry{bucket: kv.bucket, key: key, value: m.Data, rev: m.Sequence, created: m.Time, op: jetstream.KeyValuePut}
	switch m.Header.Get("KV-Operation") {
	case "DEL":
		e.op = jetstream.KeyValueDelete
	case "PURGE":
		e.op = jetstream.KeyValuePurge
	}
	return e, nil
}

// getLast reads the last message of key by a direct get or, with a read service
// (NewTeamKV), from it when nobody answers the direct get, or the other way round.
func (kv *directKV) getLast(ctx context.Context, key string) (*jetstream.RawStreamMsg, error) {
	if kv.leader == "" {
		return DirectGet(ctx, kv.nc, kv.get+key)
	}
	first, second := kv.get, kv.leader
	if kv.viaLeader.Load() {
		first, second = second, first
	}
	m, err := DirectGet(ctx, kv.nc, first+key)
	if !errors.Is(err, nats.ErrNoResponders) {
		return m, err
	}
	kv.viaLeader.Store(first == kv.get)
	return DirectGet(ctx, kv.nc, second+key)
}

// DirectGet makes a direct get in its subject form (<api prefix>.DIRECT.GET.<stream>.<subject>,
// what an export can scope to a subject) and returns the last message of the subject
// (jetstream.ErrMsgNotFound when there is none). It bounds an undeadlined ctx to 5 s.
func DirectGet(ctx context.Context, nc *nats.Conn, subject string) (*jetstream.RawStreamMsg, error) {
	return directRequest(ctx, nc, subject, nil)
}

// DirectNext makes a direct get of the first message from seq on subject (any subject
// when ""), in its body form (<api prefix>.DIRECT.GET.<stream>), and returns it
// (jetstream.ErrMsgNotFound when there is none). It bounds an undeadlined ctx to 5 s.
func DirectNext(ctx context.Context, nc *nats.Conn, api, stream string, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	body, err := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj,omitempty"`
	}{seq, subject})
	if err != nil {
		return nil, err
	}
	return directRequest(ctx, nc, api+".DIRECT.GET."+stream, body)
}

// directRequest sends a direct get and reads its answer. A stored message carries its
// sequence header; only an answer without one is a status (a 404: not found). nats.go
// takes any answer with no data and a Status header for a status, so a message someone
// stored with such a header would read as "not found" and hide every later one from a
// reader going through the stream: here it is the message it is.
func directRequest(ctx context.Context, nc *nats.Conn, subject string, body []byte) (*jetstream.RawStreamMsg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	r, err := nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return nil, fmt.Errorf("direct get %s: %w", subject, err)
	}
	if r.Header.Get(jetstream.SequenceHeader) == "" {
		if r.Header.Get("Status") == "404" {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, fmt.Errorf("direct get %s: %s %s", subject, r.Header.Get("Status"), r.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(r.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("direct get %s: sequence header: %w", subject, err)
	}
	tm, err := time.Parse(time.RFC3339Nano, r.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("direct get %s: time header: %w", subject, err)
	}
	return &jetstream.RawStreamMsg{Subject: r.Header.Get(jetstream.SubjectHeader), Sequence: seq, Header: r.Header, Data: r.Data, Time: tm}, nil
}

// Every write of a directKV is a publish that, in the accounts layout, the core's write
// service answers (package intake): a refusal of it wraps events.ErrWriteRefused or
// events.ErrTenantQuota (refusal.Wrap), as an event's publish does.

// refused reports whether err is a refusal of the core's write service: a write that a
// compare-and-set loop must not take for a lost race.
func refused(err error) bool {
	return errors.Is(err, refusal.ErrWriteRefused) || errors.Is(err, refusal.ErrTenantQuota)
}

func (kv *directKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	ack, err := kv.js.Publish(ctx, kv.subject(key), value)
	if err != nil {
		return 0, refusal.Wrap(err)
	}
	return ack.Sequence, nil
}

func (kv *directKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	ack, err := kv.js.PublishMsg(ctx, &nats.Msg{Subject: kv.subject(key), Data: value},
		jetstream.WithExpectLastSequencePerSubject(revision))
	if err != nil {
		return 0, refusal.Wrap(err)
	}
	return ack.Sequence, nil
}

// Create is Update on revision 0, or on the revision of a delete marker, as
// jetstream's Create; a key that exists is ErrKeyExists.
func (kv *directKV) Create(ctx context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.Update(ctx, key, value, 0)
	if err == nil {
		return rev, nil
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || (apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence &&
		apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return 0, err
	}
	if e, gerr := kv.last(ctx, key); gerr == nil && e.op != jetstream.KeyValuePut {
		return kv.Update(ctx, key, value, e.rev)
	}
	return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyExists)
}

func (kv *directKV) Delete(ctx context.Context, key string, _ ...jetstream.KVDeleteOpt) error {
	m := nats.NewMsg(kv.subject(key))
	m.Header.Set("KV-Operation", "DEL")
	_, err := kv.js.PublishMsg(ctx, m)
	return refusal.Wrap(err)
}

type directEntry struct {
	bucket, key string
	value       []byte
	rev         uint64
	created     time.Time
	op          jetstream.KeyValueOp
}

func (e *directEntry) Bucket() string                  { return e.bucket }
func (e *directEntry) Key() string                     { return e.key }
func (e *directEntry) Value() []byte                   { return e.value }
func (e *directEntry) Revision() uint64                { return e.rev }
func (e *directEntry) Created() time.Time              { return e.created }
func (e *directEntry) Delta() uint64                   { return 0 }
func (e *directEntry) Operation() jetstream.KeyValueOp { return e.op }

// unsupportedKV is the rest of jetstream.KeyValue for a directKV: each method returns
// ErrDirectOnly.
type unsupportedKV struct{}

func (unsupportedKV) GetRevision(context.Context, string, uint64) (jetstream.KeyValueEntry, error) {
	return nil, ErrDirectOnly
}
func (unsupportedKV) PutString(context.Context, string, string) (uint64, error) {
	return 0, ErrDirectOnly
}
func (unsupportedKV) Purge(context.Context, string, ...jetstream.KVDeleteOpt) error {
	return ErrDirectOnly
}
func (unsupportedKV) Watch(context.Context, string, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, ErrDirectOnly
}
func (unsupportedKV) WatchAll(context.Context, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, ErrDirectOnly
}
func (unsupportedKV) WatchFiltered(context.Context, []string, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, ErrDirectOnly
}
func (unsupportedKV) Keys(context.Context, ...jetstream.WatchOpt) ([]string, error) {
	return nil, ErrDirectOnly
}
func (unsupportedKV) ListKeys(context.Context, ...jetstream.WatchOpt) (jetstream.KeyLister, error) {
	return nil, ErrDirectOnly
}
func (unsupportedKV) ListKeysFiltered(context.Context, ...string) (jetstream.KeyLister, error) {
	return nil, ErrDirectOnly
}
func (unsupportedKV) History(context.Context, string, ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	return nil, ErrDirectOnly
}
func (unsupportedKV) PurgeDeletes(context.Context, ...jetstream.KVPurgeOpt) error {
	return ErrDirectOnly
}
func (unsupportedKV) Status(context.Context) (jetstream.KeyValueStatus, error) {
	return nil, ErrDirectOnly
}
