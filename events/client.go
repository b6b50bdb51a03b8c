package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events/store"
)

// ErrNotBound is returned when a client in an account of its own publishes in the name
// of an identity its account is not bound to: the account imports no such subject, so
// nothing answers.
var ErrNotBound = errors.New("events: this client account is not bound to the identity")

// ErrOneRun is returned when a client in an account of its own asks to follow the events
// of more than one run (toolbus tail with no run id, or --all): the read service answers
// only inside the runs its identity may see, one run at a time.
var ErrOneRun = errors.New("events: a client account follows one run at a time")

// openClient opens the bus of a client in an account of its own (Config.ReadPrefix).
// The account imports no JetStream API of the core: it reads through the core's read
// service (package reads), which answers stream infos and direct gets of the runs its
// identity may see under cfg.ReadPrefix, so the stream and the buckets a client reads
// are the ordinary jetstream handles on that prefix. It publishes as any client does:
// the core imports its identities' subjects.
func openClient(ctx context.Context, nc *nats.Conn, cfg Config, perms *connect.Permissions) (*Bus, error) {
	js, err := jetstream.NewWithAPIPrefix(nc, cfg.ReadPrefix, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("events: jetstream under %s: %w", cfg.ReadPrefix, err)
	}
	if perms == nil {
		perms = connect.WatchPermissions(nc)
		perms.SetHint(GrantHint)
	}
	b := &Bus{cfg: cfg, nc: nc, js: js, runCache: map[string]cachedRun{}, perms: perms, client: true}
	if b.stream, err = b.Stream(ctx, cfg.Stream); err != nil {
		return nil, fmt.Errorf("events: stream %s through the read service %s: %w", cfg.Stream, cfg.ReadPrefix, readRefusal(err, ReadIdentity(cfg.ReadPrefix)))
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
	var out []store.RunState
	return out, b.readService(ctx, ReadRunsSubject(b.ReadIdentity()), &out)
}

// readService asks the read service on subject and decodes its JSON answer into v.
func (b *Bus) readService(ctx context.Context, subject string, v any) error {
	m, err := b.nc.RequestWithContext(ctx, subject, nil)
	if err != nil {
		return fmt.Errorf("events: %s: %w", subject, readRefusal(err, b.ReadIdentity()))
	}
	if st := m.Header.Get("Status"); st != "" && len(m.Data) == 0 {
		return fmt.Errorf("events: %s: %s %s", subject, st, m.Header.Get("Description"))
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		return fmt.Errorf("events: %s: %w", subject, err)
	}
	return nil
}

// Catalog is the catalog view of the tools this bus may offer, kept current until ctx
// ends: store.Store.WatchCatalog, or in a client account the read service's list of
// the tools a live instance serves (ReadToolsSubject), which the core decides.
func (b *Bus) Catalog(ctx context.Context, log *slog.Logger) (*store.Catalog, error) {
	if !b.client {
		return b.state.WatchCatalog(ctx, log)
	}
	return store.WatchOffered(ctx, time.Second, b.OfferedTools, log)
}

// OfferedTools lists, in a client account, the tools a live instance serves, as the
// read service answers them (ReadToolsSubject); on any other bus, the catalog's tools a
// live instance serves now.
func (b *Bus) OfferedTools(ctx context.Context) ([]toolbus.ToolContract, error) {
	if !b.client {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cat, err := b.state.WatchCatalog(cctx, nil)
		if err != nil {
			return nil, err
		}
		return cat.Tools(nil), nil
	}
	var out []toolbus.ToolContract
	return out, b.readService(ctx, ReadToolsSubject(b.ReadIdentity()), &out)
}

// Contracts lists the catalog's contracts (store.Store.Contracts), or in a client
// account the tools offered (OfferedTools): it reads no catalog bucket.
func (b *Bus) Contracts(ctx context.Context) ([]toolbus.ToolContract, error) {
	if b.client {
		return b.OfferedTools(ctx)
	}
	return b.state.Contracts(ctx)
}

// Instances lists the live executor instances (store.Store.Instances); none in a
// client account, which is not told who serves a tool.
func (b *Bus) Instances(ctx context.Context) ([]store.Instance, error) {
	if b.client {
		return nil, nil
	}
	return b.state.Instances(ctx)
}

// As returns the bus that reads as identity id: this bus, unless it is a client
// account's, where it is a view on the same connection reading through id's read
// service (a front door serving several identities reads each one's runs as that
// identity; the core exports id's read service only to the accounts bound to id,
// CheckBound). Views are kept for the bus's life.
func (b *Bus) As(ctx context.Context, id string) (*Bus, error) {
	if !b.client || id == b.ReadIdentity() {
		return b, nil
	}
	b.mu.Lock()
	v, ok := b.views[id]
	b.mu.Unlock()
	if ok {
		return v, nil
	}
	if err := b.CheckBound(ctx, id); err != nil {
		return nil, err
	}
	cfg := b.cfg
	cfg.ReadPrefix = ReadAPIPrefix(id)
	v, err := openClient(ctx, b.nc, cfg, b.perms)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.views[id]; ok {
		return old, nil
	}
	if b.views == nil {
		b.views = map[string]*Bus{}
	}
	v.signer.Store(b.signer.Load())
	b.views[id] = v
	return v, nil
}

// notBound names the identity a client account may not publish for: in such an account
// the publish of an identity it is not bound to finds no responder. A refusal of the
// core's write service is told as such (writeRefusal).
func (b *Bus) notBound(subject string, err error) error {
	if r := writeRefusal(err); r != err {
		return r
	}
	if !b.client || !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		return err
	}
	toks := strings.Split(subject, ".")
	id := toks[len(toks)-1]
	if id == b.ReadIdentity() {
		// The account reads as id, so it is bound to it: nothing answers because no
		// injector runs the core's write service (or the core has not been upgraded).
		return fmt.Errorf("events: publish %s: no injector of the core answers this client account's writes (the write service, TOOLBUS_WRITE_SERVICE): %w", subject, err)
	}
	return fmt.Errorf("%w %s (it may publish %s only for the identities it is bound to; an administrator binds one with `toolbus admin add-client NAME %s`; for an identity it is bound to, nothing answers while no injector runs): %w",
		ErrNotBound, id, subject, id, err)
}

// storedAt reads the message stored at seq, if it is on subject. A client account reads
// no message by sequence alone (the read service answers only inside its runs).
func (b *Bus) storedAt(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	if !b.client {
		return getMsg(ctx, b.stream, seq, "")
	}
	raw, err := getMsg(ctx, b.stream, seq, subject)
	if err == nil && raw.Sequence != seq {
		return nil, jetstream.ErrMsgNotFound
	}
	return raw, err
}

// CheckWatch refuses, in a client account, a watch of anything but one run's events
// (SubjectRun of a literal run id or subjects inside it).
func (b *Bus) CheckWatch(filter string) error {
	if !b.client {
		return nil
	}
	rest, _ := strings.CutPrefix(filter, SubjectPrefix+".")
	run, _, _ := strings.Cut(rest, ".")
	if rest != filter && toolbus.ValidRunID(run) {
		return nil
	}
	return fmt.Errorf("%w (toolbus tail RUN, toolbus runs lists them): %s names no one run, and the core's read service answers a client only inside the runs its identity %s may see, never across runs",
		ErrOneRun, filter, b.ReadIdentity())
}

// ReadIdentity is the identity a client account reads as (its ReadPrefix's).
func (b *Bus) ReadIdentity() string { return ReadIdentity(b.cfg.ReadPrefix) }

// CheckBound returns an error wrapping ErrNotBound when the bus is a client account's
// and its account is not bound to the identity id, before anything is read or
// published in id's name; nil otherwise (or when it cannot tell: what publishes in id's
// name says then). The core exports the read service of id only to the accounts bound
// to id, so in any other account nothing answers there.
func (b *Bus) CheckBound(ctx context.Context, id string) error {
	if !b.client {
		return nil
	}
	_, err := b.nc.RequestWithContext(ctx, ReadAPIPrefix(id)+".STREAM.INFO."+b.cfg.Stream, nil)
	if !errors.Is(err, nats.ErrNoResponders) {
		return nil
	}
	return fmt.Errorf("%w %s: it acts only as the identities it is bound to (this one reads as %s; an administrator binds one with `toolbus admin add-client NAME %s`)",
		ErrNotBound, id, b.ReadIdentity(), id)
}

// ErrTenantCredentials is wrapped by a refusal of what a tenant's credentials cannot
// do (a *TenantRefusal).
var ErrTenantCredentials = errors.New("events: not what these credentials do")

// TenantRefusal is what a tenant's credentials cannot do, said in one sentence (Msg:
// what they can do and what to use instead), with the error the server gave (Err),
// which its text leaves out: a command prints Msg alone.
type TenantRefusal struct {
	Msg string
	Err error
}

func (e *TenantRefusal) Error() string   { return e.Msg }
func (e *TenantRefusal) Unwrap() []error { return []error{ErrTenantCredentials, e.Err} }

// TeamRefusal says, for command cmd of a process with these settings, what a team's
// executor credentials (APIPrefix: a team account reaches its tools' calls only) can do
// and what to use instead; "" for other credentials. The caller asks it of the commands
// that read or act on runs.
func (c Config) TeamRefusal(cmd string) string {
	if c.APIPrefix == "" || c.ReadPrefix != "" {
		return ""
	}
	return cmd + ": these are a team's executor credentials (TOOLBUS_NATS_API_PREFIX): they serve the team's own tools (toolbus executor) and read no run; run, read and decide runs with a client's credentials bound to your identity (toolbus admin add-client NAME IDENTITY, TOOLBUS_NATS_READ_PREFIX), and set up the core with the admin's"
}

// readRefusal says why nothing answers a client account's read of identity id (no
// responders): the account is not bound to id, or no injector of the core runs the read
// service; any other error unchanged.
func readRefusal(err error, id string) error {
	if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
		return err
	}
	return &TenantRefusal{Err: err, Msg: fmt.Sprintf("nothing answers the read service of identity %s: these client credentials read only as the identities their account is bound to (TOOLBUS_NATS_READ_PREFIX=%s names %s; an administrator binds one with `toolbus admin add-client NAME %s`), or no injector of the core runs the read service",
		id, ReadAPIPrefix(id), id, id)}
}
