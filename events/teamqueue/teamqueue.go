// Package teamqueue binds a tool's queue from a team account: the pulls an executor in
// a team makes of the core's queue, without any JetStream request whose cost other
// tenants share (Probe, Open, Consumer).
package teamqueue

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

	"github.com/toolbus/toolbus/events"
)

// A team's executor asks the core's JetStream API nothing whose cost other tenants
// share: the server answers every account's infos (stream, consumer, account) from one
// queue, so a team that could ask its queue's consumer info could flood that queue and
// time out everyone's (issue 54). The core exports a team only what the pulls of its
// queues need (CONSUMER.MSG.NEXT and the acknowledgements, which the consumer handles
// itself), and the team's executors learn all they need from the pulls' answers: a
// message, a heartbeat, "no messages" (404), "request timeout" (408), "consumer
// deleted" (409) and, when its credentials no longer reach the queue (the tool was
// revoked, or its queue was never made), the server's "no responders" (503).

// ErrUnreachable is what a pull of a team's queue is answered when the team's
// account no longer imports it (revoked) or the core holds no such consumer.
var ErrUnreachable = errors.New("events: the queue is not reachable with these credentials")

// Probe asks the server whether tool's queue is reachable with a pull that can take
// nothing (no_wait, max_bytes 1: the server answers 404 when nothing is pending and 409
// "Message Size Exceeds MaxBytes" when something is, and delivers nothing). It returns
// nil when the queue answered, ErrUnreachable (wrapping nats.ErrNoResponders) when
// nobody did, or the request's error.
func Probe(ctx context.Context, b *events.Bus, tool string) error {
	m, err := b.Conn().RequestWithContext(ctx, queueNext(b, tool), []byte(`{"batch":1,"max_bytes":1,"no_wait":true}`))
	if errors.Is(err, nats.ErrNoResponders) || (err == nil && m.Header.Get("Status") == "503") {
		return fmt.Errorf("%w: %s: %w", ErrUnreachable, events.ToolConsumer(tool), nats.ErrNoResponders)
	}
	if err != nil {
		return fmt.Errorf("events: probe the queue of %s: %w", tool, err)
	}
	if m.Header.Get("Status") == "409" && m.Header.Get("Description") == "Consumer Deleted" {
		return fmt.Errorf("%w: %s: consumer deleted", ErrUnreachable, events.ToolConsumer(tool))
	}
	return nil
}

func queueNext(b *events.Bus, tool string) string {
	api := b.Config().APIPrefix
	if api == "" {
		api = "$JS.API"
	}
	return api + ".CONSUMER.MSG.NEXT." + events.QueueStreamName(b.Config().Stream) + "." + events.ToolConsumer(tool)
}

// Open is the durable consumer of tool's queue as an executor in a team account
// binds it: without a request (its config is what `toolbus init` makes: the tool's
// queue subject and ackWait, the caller's own AckWait, which it cannot read), pulled by
// ConsumePulls. Its Info is not available (events.ErrTeamAccount): Probe says whether
// it is reachable.
func Open(b *events.Bus, tool string, ackWait time.Duration) *Consumer {
	name := events.ToolConsumer(tool)
	return &Consumer{nc: b.Conn(), next: queueNext(b, tool), info: jetstream.ConsumerInfo{
		Stream: events.QueueStreamName(b.Config().Stream), Name: name,
		Config: jetstream.ConsumerConfig{Durable: name, FilterSubject: events.SubjectQueue(tool), AckWait: ackWait, AckPolicy: jetstream.AckExplicitPolicy},
	}}
}

// Consumer is a tool's queue bound in a team account (Open).
type Consumer struct {
	jetstream.Consumer // Fetch, Next, Messages: not available (nil)
	nc                 *nats.Conn
	next               string
	info               jetstream.ConsumerInfo
}

// CachedInfo is the consumer's name and config as the team assumes them.
func (c *Consumer) CachedInfo() *jetstream.ConsumerInfo { i := c.info; return &i }

// Info is not available in a team account: the core exports no consumer info.
func (c *Consumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	return nil, fmt.Errorf("%w: info of consumer %s (its pulls say what a team needs)", events.ErrTeamAccount, c.info.Name)
}

// Consume is ConsumePulls with a batch of 64, pulls of two minutes and heartbeats every
// events.TenantAnswerGap (the options of a jetstream consume are not readable outside
// nats.go).
func (c *Consumer) Consume(h jetstream.MessageHandler, _ ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	return c.ConsumePulls(h, 64, 2*time.Minute, events.TenantAnswerGap, nil)
}

// ConsumePulls delivers the queue's messages to h (called in order, on one goroutine;
// it may block) with one pull of batch messages at a time, each lasting expiry with the
// server's heartbeats every heartbeat: a pull answered in full, ended by the server
// (404, 408, 409), silent for two heartbeats or cut by a reconnection is followed by
// the next at once; one answered "no responders" (or "consumer deleted") calls onErr and
// is followed by the next after a backoff (up to 5 s), so a queue granted again is
// pulled again by itself. A heartbeat longer than events.TenantAnswerGap (or none) is
// that gap, at most half the expiry: the core forgets the way back of a pull silent for
// twice it (accounts.ResponseThreshold), and a call then delivered to the pull would
// reach no one until its ack wait ended (measured: the server counts it delivered).
func (c *Consumer) ConsumePulls(h jetstream.MessageHandler, batch int, expiry, heartbeat time.Duration, onErr func(error)) (jetstream.ConsumeContext, error) {
	if onErr == nil {
		onErr = func(error) {}
	}
	if heartbeat <= 0 || heartbeat > events.TenantAnswerGap {
		heartbeat = min(events.TenantAnswerGap, expiry/2)
	}
	p := &teamPull{c: c, h: h, batch: max(1, batch), expiry: expiry, heartbeat: heartbeat, onErr: onErr,
		kick: make(chan time.Duration, 1), stop: make(chan struct{}), closed: make(chan struct{})}
	sub, err := c.nc.Subscribe(c.nc.NewInbox(), p.receive)
	if err != nil {
		return nil, fmt.Errorf("events: pull %s: %w", c.info.Name, err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	p.sub = sub
	p.heard.Store(time.Now().UnixNano())
	p.kick <- 0
	go p.loop()
	return p, nil
}

// teamPull is one ConsumePulls: its inbox and the state of its current pull.
type teamPull struct {
	c                 *Consumer
	h                 jetstream.MessageHandler
	batch             int
	expiry, heartbeat time.Duration
	onErr             func(error)
	sub               *nats.Subscription

	mu      sync.Mutex
	pending int // messages the current pull may still deliver
	backoff time.Duration
	heard   atomic.Int64 // unix nanos of the last word of the server

	kick         chan time.Duration // pull again after the delay
	stop, closed chan struct{}
	stopOnce     sync.Once
	drain        bool
}

func (p *teamPull) loop() {
	defer close(p.closed)
	tick := time.NewTicker(min(max(p.heartbeat/2, 10*time.Millisecond), time.Second))
	defer tick.Stop()
	var wait <-chan time.Time
	reconnects := p.c.nc.Stats().Reconnects
	for {
		select {
		case <-p.stop:
			if p.drain {
				_ = p.sub.Drain()
			} else {
				_ = p.sub.Unsubscribe()
			}
			return
		case d := <-p.kick:
			if d > 0 {
				wait = time.After(d)
				continue
			}
			p.pull()
		case <-wait:
			wait = nil
			p.pull()
		case <-tick.C:
			if r := p.c.nc.Stats().Reconnects; r != reconnects {
				reconnects = r
				p.pull() // the server may have lost the pull (restarted): pull afresh at once
			} else if time.Since(time.Unix(0, p.heard.Load())) > 2*p.heartbeat && wait == nil {
				p.pull() // the pull was lost without a word
			}
		}
	}
}

func (p *teamPull) pull() {
	req, _ := json.Marshal(map[string]any{"batch": p.batch, "expires": p.expiry.Nanoseconds(), "idle_heartbeat": p.heartbeat.Nanoseconds()})
	p.mu.Lock()
	p.pending = p.batch
	p.mu.Unlock()
	p.heard.Store(time.Now().UnixNano())
	if err := p.c.nc.PublishRequest(p.c.next, p.sub.Subject, req); err != nil {
		p.again(time.Second)
	}
}

// again asks the loop for the next pull after d (0: now).
func (p *teamPull) again(d time.Duration) {
	select {
	case p.kick <- d:
	default:
	}
}

func (p *teamPull) receive(m *nats.Msg) {
	p.heard.Store(time.Now().UnixNano())
	if len(m.Data) == 0 && m.Header.Get("Status") != "" {
		p.status(m.Header.Get("Status"), m.Header.Get("Description"))
		return
	}
	p.mu.Lock()
	p.backoff = 0
	p.pending--
	done := p.pending <= 0
	p.mu.Unlock()
	if done {
		p.again(0)
	}
	p.h(&teamMsg{m: m, nc: p.c.nc})
}

func (p *teamPull) status(code, desc string) {
	switch {
	case code == "100": // heartbeat
		return
	case code == "404", code == "408":
		p.again(0)
		return
	case code == "503", code == "409" && desc == "Consumer Deleted":
		err := fmt.Errorf("%w: %s: %s %s", ErrUnreachable, p.c.info.Name, code, desc)
		if code == "503" {
			err = fmt.Errorf("%w: %w", err, nats.ErrNoResponders)
		}
		p.onErr(err)
	default: // 409 (max waiting, leadership change, ...), 400: pull again shortly
		p.onErr(fmt.Errorf("events: pull %s: %s %s", p.c.info.Name, code, desc))
	}
	p.mu.Lock()
	p.backoff = min(max(2*p.backoff, 100*time.Millisecond), 5*time.Second)
	d := p.backoff
	p.mu.Unlock()
	p.again(d)
}

func (p *teamPull) Stop()                   { p.stopOnce.Do(func() { close(p.stop) }) }
func (p *teamPull) Drain()                  { p.stopOnce.Do(func() { p.drain = true; close(p.stop) }) }
func (p *teamPull) Closed() <-chan struct{} { return p.closed }

// teamMsg is a message of a team's queue: acknowledged on its reply subject (the
// core's ack subjects, imported by the team).
type teamMsg struct {
	m    *nats.Msg
	nc   *nats.Conn
	once sync.Once
}

func (t *teamMsg) Data() []byte         { return t.m.Data }
func (t *teamMsg) Headers() nats.Header { return t.m.Header }
func (t *teamMsg) Subject() string      { return t.m.Subject }
func (t *teamMsg) Reply() string        { return t.m.Reply }

func (t *teamMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := t.m.Metadata()
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp, Stream: md.Stream,
		Consumer: md.Consumer, Domain: md.Domain}, nil
}

// final sends a terminal acknowledgement once.
func (t *teamMsg) final(body string) error {
	var err error = jetstream.ErrMsgAlreadyAckd
	t.once.Do(func() { err = t.m.Respond([]byte(body)) })
	return err
}

func (t *teamMsg) Ack() error  { return t.final("+ACK") }
func (t *teamMsg) Nak() error  { return t.final("-NAK") }
func (t *teamMsg) Term() error { return t.final("+TERM") }
func (t *teamMsg) TermWithReason(reason string) error {
	return t.final("+TERM " + reason)
}
func (t *teamMsg) NakWithDelay(d time.Duration) error {
	return t.final(`-NAK {"delay":` + strconv.FormatInt(d.Nanoseconds(), 10) + `}`)
}
func (t *teamMsg) InProgress() error { return t.m.Respond([]byte("+WPI")) }

func (t *teamMsg) DoubleAck(ctx context.Context) error {
	var err error = jetstream.ErrMsgAlreadyAckd
	t.once.Do(func() { _, err = t.nc.RequestWithContext(ctx, t.m.Reply, []byte("+ACK")) })
	return err
}
