package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events/store"
)

// ErrNotBound is returned when a client in an account of its own publishes in the name
// of an identity its account is not bound to: the account imports no such subject, so
// nothing answers.
var ErrNotBound = errors.New("events: this client account is not bound to the identity")

// openClient opens the bus of a client in an account of its own (Config.ReadPrefix).
// The account imports no JetStream API of the core: it reads through the core's read
// service (package reads), which answers stream infos and direct gets of the runs its
// identity may see under cfg.ReadPrefix, so the stream and the buckets a client reads
// are the ordinary jetstream handles on that prefix. It publishes as any client does:
// the core imports its identities' subjects.
func openClient(ctx context.Context, nc *nats.Conn, cfg Config) (*Bus, error) {
	js, err := jetstream.NewWithAPIPrefix(nc, cfg.ReadPrefix, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("events: jetstream under %s: %w", cfg.ReadPrefix, err)
	}
	b := &Bus{cfg: cfg, nc: nc, js: js, runCache: map[string]cachedRun{}, perms: connect.WatchPermissions(nc), client: true}
	b.perms.SetHint(GrantHint)
	if b.stream, err = js.Stream(ctx, cfg.Stream); err != nil {
		return nil, fmt.Errorf("events: stream %s through the read service %s (is an injector running?): %w", cfg.Stream, cfg.ReadPrefix, err)
	}
	b.reader = b.stream
	kvs := store.Buckets{JS: js}
	for _, bk := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{
		{store.BucketHistory, &kvs.History}, {store.BucketRuns, &kvs.Runs}, {store.BucketTools, &kvs.Tools},
		{store.BucketApprovals, &kvs.Approvals}, {store.BucketOutputs, &kvs.Outputs},
	} {
		if *bk.kv, err = js.KeyValue(ctx, bk.name); err != nil {
			return nil, fmt.Errorf("events: bucket %s through the read service %s: %w", bk.name, cfg.ReadPrefix, err)
		}
	}
	// A client never reads claims or instances; the read service offers neither.
	kvs.Claims = store.NewDirectKV(js, nc, cfg.ReadPrefix, store.BucketClaims)
	kvs.Instances = store.NewDirectKV(js, nc, cfg.ReadPrefix, store.BucketInstances)
	b.state = store.New(kvs, cfg.InstanceTTL)
	return b, nil
}

// ClientAccount reports whether the bus was opened by a client in an account of its own
// (Config.ReadPrefix): it reads only the runs its identity may see, through the read
// service.
func (b *Bus) ClientAccount() bool { return b.client }

// Runs lists the states of the runs this bus may see: every run, or in a client
// account those its identity may see (the read service's list).
func (b *Bus) Runs(ctx context.Context) ([]store.RunState, error) {
	if !b.client {
		return b.state.Runs(ctx)
	}
	subject := strings.TrimSuffix(b.cfg.ReadPrefix, ".API") + ".runs"
	m, err := b.nc.RequestWithContext(ctx, subject, nil)
	if err != nil {
		return nil, fmt.Errorf("events: runs through the read service %s: %w", subject, err)
	}
	if st := m.Header.Get("Status"); st != "" && len(m.Data) == 0 {
		return nil, fmt.Errorf("events: runs through the read service: %s %s", st, m.Header.Get("Description"))
	}
	var out []store.RunState
	if err := json.Unmarshal(m.Data, &out); err != nil {
		return nil, fmt.Errorf("events: runs through the read service: %w", err)
	}
	return out, nil
}

// notBound names the identity a client account may not publish for: in such an account
// the publish of an identity it is not bound to finds no responder.
func (b *Bus) notBound(subject string, err error) error {
	if !b.client || !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		return err
	}
	toks := strings.Split(subject, ".")
	return fmt.Errorf("%w %s (it may publish %s only for the identities it is bound to; an administrator binds one with `toolbus admin add-client NAME %s`): %w",
		ErrNotBound, toks[len(toks)-1], subject, toks[len(toks)-1], err)
}

// storedAt reads the message stored at seq, if it is on subject. A client account reads
// no message by sequence alone (the read service answers only inside its runs).
func (b *Bus) storedAt(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	if !b.client {
		return getMsg(ctx, b.stream, seq)
	}
	raw, err := getMsg(ctx, b.stream, seq, jetstream.WithGetMsgSubject(subject))
	if err == nil && raw.Sequence != seq {
		return nil, jetstream.ErrMsgNotFound
	}
	return raw, err
}
