// Package intake is the core account's door for what tenants store (docs/tenancy-design.md,
// "Writes of tenants"). In the accounts layout a team or a client account imports no
// subject of the core's streams: each subject it may write is imported from the core
// under events.WriteServicePrefix, and this service, run by every injector, checks each
// message before it forwards it to the stream:
//
//   - its form: a team writes its tools' results, waits, progress, logs and questions and
//     its keys of the claims, outputs, catalog, instances and secrets buckets; a client
//     its identity's starts, cancels, decisions and answers (the server's import already
//     narrows both to the tenant's own tools, team and identities), with every token
//     checked: a run id, a tool name, a key of the shape toolbus writes;
//   - its headers: only those toolbus's own writes send, with values it checks
//     (headers.go): no roll-up (a Nats-Rollup would purge every other tenant's keys of
//     a bucket), no condition on another's messages, a message id only the tenant's own;
//   - its size: a client's run.started within Limits.MaxStartBytes, a decision, cancel
//     or answer within events.MaxDecisionBytes;
//   - the tenant's bytes per second (Limits.BytesPerSecond: subject, headers, data and
//     MessageOverhead), so one tenant cannot fill the store the others write to.
//   - a team's keys of each shared bucket and the bytes of each value (Limits.Buckets,
//     buckets.go), and its claims' bytes (Limits.ClaimsShare, share.go), so one team
//     cannot fill a bucket the others need.
//
// A message it admits is published on its own subject at once, in the order received,
// with a reply subject of the service's (a client may not publish with the tenant's
// reply subject: the server reserves it), and the stream's acknowledgement is relayed to
// the tenant as it comes, in the service's words (answers.go), so the service waits for
// no acknowledgement before the next write. A message it refuses gets an answer in the
// form of the stream's (a pub ack with an error, code 400 or 429 and
// events.WriteRefusedErrCode or events.WriteQuotaErrCode) at once: a refusal, never a
// stall.
package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// DefaultBytesPerSecond is the injector's bound of each tenant's bytes per second
// (TOOLBUS_TENANT_BYTES_PER_SECOND unless set; `toolbus admin init` says so): a
// megabyte a second, and a minute of it at once, is far more than the results, logs and
// outputs of a busy team need, and keeps one tenant from filling the store unbounded.
const DefaultBytesPerSecond = 1 << 20

// Limits bound what one tenant stores. Zero values bound nothing (the injector's
// configuration bounds by default: TOOLBUS_TENANT_BYTES_PER_SECOND).
type Limits struct {
	// BytesPerSecond is the bytes (subject, headers, data and MessageOverhead) one tenant
	// (a team, or a client's identity) may store per second, per instance of the service.
	BytesPerSecond float64
	// Burst is the bytes a tenant may store at once beyond the rate (0: a minute of the
	// rate, and at least the server's max_payload with a subject and MessageOverhead, so
	// that every message can pass).
	Burst int
	// MaxStartBytes bounds a client's run.started (JSON bytes of its data).
	MaxStartBytes int
	// Buckets bound a team's keys of each shared bucket, by bucket name (buckets.go;
	// DefaultBucketBounds).
	Buckets map[string]BucketBound
	// StreamShare bounds a tenant's bytes in the event stream (share.go).
	StreamShare StreamShare
	// ClaimsShare bounds a team's bytes in the claims bucket (share.go; its Window is
	// the bucket's TTL, the stream's retention).
	ClaimsShare StreamShare
}

// Metrics counts what the service refuses (telemetry.Metrics implements it).
type Metrics interface {
	// WriteRefused counts a write of tenant (team.<team> or client.<identity>) refused
	// with code (400 or 429).
	WriteRefused(tenant string, code int)
}

// Service admits tenants' writes on a connection of the core account.
type Service struct {
	nc      *nats.Conn
	lim     Limits
	log     *slog.Logger
	metrics Metrics

	mu      sync.Mutex
	budgets map[string]*rate.Limiter // by kind.name
	inbox   string                   // prefix of the reply subjects of forwarded writes
	next    uint64
	waiting map[string]pending // by the last token of a forwarded write's reply subject

	counts map[string]*keyCount   // by the filter of a prefix's keys (buckets.go; made on first use)
	shares map[string]*shareCount // by kind.name (and "<kind.name> claims"): bytes on the event stream and in the claims (share.go; made on first use)

	admitted, refused atomic.Uint64
	warn              rate.Sometimes
}

// New returns the write service on nc, a connection of the core account whose user may
// publish every subject tenants write.
func New(nc *nats.Conn, lim Limits, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{nc: nc, lim: lim, log: log, budgets: map[string]*rate.Limiter{}, warn: rate.Sometimes{Interval: time.Second}, inbox: nats.NewInbox(), waiting: map[string]pending{}}
}

// pending is a forwarded write whose acknowledgement the tenant waits for.
type pending struct {
	reply string
	at    time.Time
}

// ackWait is how long the service keeps the reply subject of a forwarded write: the
// tenant has given up long before.
const ackWait = time.Minute

// Observe has the service count its refusals in m; call it before Serve.
func (s *Service) Observe(m Metrics) { s.metrics = m }

// Counts returns how many writes the service admitted and refused.
func (s *Service) Counts() (admitted, refused uint64) { return s.admitted.Load(), s.refused.Load() }

// Serve admits writes in the queue group events.WriteQueue (every instance shares the
// work) until ctx ends, then drains its subscription: every write received is forwarded
// or refused. Writes are handled one at a time in the order received, so one tenant's
// writes reach the stream in the order this instance got them.
func (s *Service) Serve(ctx context.Context) error {
	acks, err := s.nc.Subscribe(s.inbox+".*", s.relay)
	if err != nil {
		return fmt.Errorf("intake: subscribe: %w", err)
	}
	defer func() { _ = acks.Unsubscribe() }()
	sub, err := s.nc.QueueSubscribe(events.WriteServicePrefix+".>", events.WriteQueue, s.admit)
	if err != nil {
		return fmt.Errorf("intake: subscribe: %w", err)
	}
	// Outputs are written in chunks of up to a megabyte: room for a burst of them.
	if err := sub.SetPendingLimits(-1, 512<<20); err != nil {
		return fmt.Errorf("intake: %w", err)
	}
	if err := s.nc.Flush(); err != nil {
		return fmt.Errorf("intake: subscribe: %w", err)
	}
	<-ctx.Done()
	if err := sub.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("intake: drain: %w", err)
	}
	// Drain is asynchronous: wait (a while) for the writes received to be forwarded and
	// for the stream's acknowledgements of those forwarded to be relayed.
	deadline := time.Now().Add(5 * time.Second)
	for (sub.IsValid() || s.awaiting() > 0) && s.nc.IsConnected() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// refusal is a write the service does not admit.
type refusal struct {
	code, errCode int
	desc          string
}

func (r *refusal) Error() string { return r.desc }

func refuse(format string, args ...any) *refusal {
	return &refusal{code: 400, errCode: events.WriteRefusedErrCode, desc: "toolbus intake: " + fmt.Sprintf(format, args...)}
}

// admit checks one write and forwards it, or answers its refusal.
func (s *Service) admit(m *nats.Msg) {
	kind, name, subject, ok := events.ParseWriteSubject(m.Subject)
	var (
		r *refusal
		h nats.Header
	)
	if !ok {
		r = refuse("%s is no write of a tenant", m.Subject)
	} else {
		h, r = s.check(kind, name, subject, m)
	}
	if r != nil {
		s.refused.Add(1)
		if s.metrics != nil {
			s.metrics.WriteRefused(kind+"."+name, r.code)
		}
		// A flood of refused writes logs one line a second, not one per write.
		s.warn.Do(func() {
			s.log.Warn("intake: write refused", "subject", m.Subject, "code", r.code, "reason", r.desc, "refused_so_far", s.refused.Load())
		})
		s.answer(m, r)
		return
	}
	out := &nats.Msg{Subject: subject, Data: m.Data}
	if len(h) > 0 {
		out.Header = h
	}
	if m.Reply != "" {
		out.Reply = s.await(m.Reply)
	}
	if err := s.nc.PublishMsg(out); err != nil {
		s.log.Warn("intake: forward", "subject", subject, "err", err)
		s.answer(m, &refusal{code: 503, errCode: events.WriteRefusedErrCode, desc: "toolbus intake: forward: " + err.Error()})
		return
	}
	s.admitted.Add(1)
}

// await notes that the tenant waits on reply for the acknowledgement of a write and
// returns the reply subject to forward it with. Notes older than ackWait are dropped.
func (s *Service) await(reply string) string {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	if s.next%1024 == 0 {
		for k, p := range s.waiting {
			if now.Sub(p.at) > ackWait {
				delete(s.waiting, k)
			}
		}
	}
	tok := strconv.FormatUint(s.next, 36)
	s.waiting[tok] = pending{reply: reply, at: now}
	return s.inbox + "." + tok
}

// awaiting is the number of forwarded writes whose acknowledgement was not relayed.
func (s *Service) awaiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// relay gives the stream's acknowledgement of a forwarded write to the tenant, in the
// service's own words (answerOf): never the stream's text, which for a failed condition
// names the last message id or sequence of the subject, another's included.
func (s *Service) relay(m *nats.Msg) {
	tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	s.mu.Lock()
	p, ok := s.waiting[tok]
	delete(s.waiting, tok)
	s.mu.Unlock()
	if !ok {
		return
	}
	if err := s.nc.PublishMsg(answerOf(p.reply, m)); err != nil {
		s.log.Warn("intake: relay", "err", err)
	}
}

// check returns why a write of the tenant kind.name on subject is refused, or nil, and
// the header to forward it with (only what toolbus's own writes send: headers).
func (s *Service) check(kind, name, subject string, m *nats.Msg) (nats.Header, *refusal) {
	if m.Header.Get(jsRollup) != "" {
		return nil, refuse("%s: a roll-up (%s header) is not a tenant's to make: it would purge the other tenants' messages", subject, jsRollup)
	}
	var r *refusal
	if kind == events.WriteTeam {
		r = teamForm(name, subject)
	} else {
		r = s.clientForm(name, subject, len(m.Data))
	}
	if r != nil {
		return nil, r
	}
	h, r := headers(kind, name, subject, strings.HasPrefix(subject, "$KV."), m.Header)
	if r != nil {
		return nil, r
	}
	if r := s.spend(kind+"."+name, subject, h, m.Data); r != nil {
		return nil, r
	}
	return h, s.hold(kind, name, subject, m)
}

// jsRollup is the header that asks a stream to purge the subject, or the whole stream,
// once the message is stored.
const jsRollup = "Nats-Rollup"

// teamBuckets are the buckets a team writes keys of.
var teamBuckets = map[string]bool{
	store.BucketClaims: true, store.BucketOutputs: true, store.BucketTools: true,
	store.BucketInstances: true, store.BucketSecrets: true,
}

// teamEvents are the events a team publishes of its tools' calls.
var teamEvents = map[string]bool{"finished": true, "waiting": true, "progress": true, "log": true, "question": true}

// teamForm refuses a subject that is none of team's writes. The import narrows it to
// the team's own tools and keys; this is the form, checked again behind the boundary,
// with every token of it: a run id and a tool name as the contract bounds them, a key
// of the shape toolbus writes (store.TeamKeyShape).
func teamForm(team, subject string) *refusal {
	toks := strings.SplitN(subject, ".", 3)
	switch {
	case len(toks) == 3 && toks[0] == "$KV" && teamBuckets[toks[1]]:
		if store.TeamKeyShape(toks[1], team, toks[2]) {
			return nil
		}
		return refuse("%s: the key is none toolbus writes in %s (store.TeamKeyShape: its tools' and its own keys, each token within its bound)", subject, toks[1])
	case len(toks) == 3 && toks[0] == events.SubjectPrefix:
		toks = strings.Split(subject, ".")
		if len(toks) == 5 && toks[2] == "tool" && teamEvents[toks[3]] && toolbus.ValidRunID(toks[1]) && toolbus.ValidToolName(toks[4]) {
			return nil
		}
	}
	return refuse("%s is no write of a team (its tools' results, waits, progress, logs, questions and its keys)", subject)
}

// clientEvents are the events a client publishes in its identity's name, by their
// third and fourth tokens.
var clientEvents = map[string]bool{"run.started": true, "run.cancel": true, "approval.granted": true, "approval.denied": true, "tool.answer": true}

// clientForm refuses a subject that is none of the identity id's writes, or whose data
// is over its bound.
func (s *Service) clientForm(id, subject string, size int) *refusal {
	toks := strings.Split(subject, ".")
	if len(toks) != 5 || toks[0] != events.SubjectPrefix || !toolbus.ValidRunID(toks[1]) || !clientEvents[toks[2]+"."+toks[3]] || toks[4] != id {
		return refuse("%s is no write of identity %s (its starts, cancels, decisions and answers)", subject, id)
	}
	bound, what := events.MaxDecisionBytes, "events.MaxDecisionBytes"
	if toks[2]+"."+toks[3] == "run.started" {
		bound, what = s.lim.MaxStartBytes, "TOOLBUS_MAX_START_BYTES"
	}
	if bound > 0 && size > bound {
		return refuse("%s: %d bytes of data are over the bound of %d (%s)", subject, size, bound, what)
	}
	return nil
}

// MessageOverhead is what the service charges a write beyond its subject, headers and
// data: the stream's own record of each message (34 bytes in the file store: length,
// sequence, time, subject and header lengths, checksum) and its index of the message and
// of a new subject, rounded up. A write of nothing is not free: an empty write on a long
// subject costs what it stores.
const MessageOverhead = 64

// spend takes the write's bytes from the tenant's budget: its subject, the header it is
// forwarded with, its data and MessageOverhead.
func (s *Service) spend(tenant, subject string, h nats.Header, data []byte) *refusal {
	n := len(subject) + len(data) + MessageOverhead
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	if s.lim.BytesPerSecond <= 0 {
		return s.share(tenant, subject, n)
	}
	s.mu.Lock()
	b := s.budgets[tenant]
	if b == nil {
		burst := s.lim.Burst
		if burst <= 0 {
			// At least a message of the server's max_payload with its subject (a control
			// line is at most 4 KiB) and MessageOverhead: every message can pass.
			burst = max(int(s.lim.BytesPerSecond*60), int(s.nc.MaxPayload())+4<<10+MessageOverhead)
		}
		b = rate.NewLimiter(rate.Limit(s.lim.BytesPerSecond), burst)
		s.budgets[tenant] = b
	}
	s.mu.Unlock()
	if n > b.Burst() {
		// Never passes, however long the tenant waits: refused for good, not over quota.
		return refuse("a write of %d bytes is over %s's burst of %d bytes (TOOLBUS_TENANT_BYTES_BURST): it can never pass", n, tenant, b.Burst())
	}
	if !b.AllowN(time.Now(), n) {
		return &refusal{code: 429, errCode: events.WriteQuotaErrCode, desc: fmt.Sprintf(
			"toolbus intake: quota_exceeded: %s is over its %.0f bytes per second (TOOLBUS_TENANT_BYTES_PER_SECOND): retry later", tenant, s.lim.BytesPerSecond)}
	}
	return s.share(tenant, subject, n)
}

// answer tells the writer its write was refused, as the stream tells a publish it
// refuses: a pub ack with an error.
func (s *Service) answer(m *nats.Msg, r *refusal) {
	if m.Reply == "" {
		return
	}
	data := refusalData(r)
	if err := s.nc.Publish(m.Reply, data); err != nil {
		s.log.Warn("intake: answer", "subject", m.Subject, "err", err)
	}
}
