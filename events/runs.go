package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/store"
)

// ErrRunExists: a run with that id was already submitted (at any age); a run id names
// one run forever.
var ErrRunExists = errors.New("events: run id already exists")

// headerExpectedLastSubjSeqSubj names the subject, wildcards allowed, whose last sequence
// Nats-Expected-Last-Subject-Sequence checks instead of the message's own subject.
const headerExpectedLastSubjSeqSubj = "Nats-Expected-Last-Subject-Sequence-Subject"

// errRunHasMessages: a run.started published as the first message of its run was not
// stored so (the run's subjects hold a message, or its id was taken): StartRun decides
// by reading.
var errRunHasMessages = errors.New("events: the run's subjects hold a message")

// StartRun submits a run: it publishes run.started, and nothing else. The injector that
// consumes the first run.started of a run id records the run and asks for step 0.
//
// A new run id costs one publish: the run.started is published on condition that no
// message of the run exists (Nats-Expected-Last-Subject-Sequence 0 over
// toolbus.<run>.>), so the server stores it only as the run's first message, and of
// two concurrent submissions of one id it stores one. When the condition fails, the
// run's subjects are read as before: an id that already has a run.started is refused
// with ErrRunExists and nothing is published; messages of the run that are no
// run.started of it (forgeries, which consumers terminate) do not keep the id from
// starting, and a publish the stream reports as a duplicate (a concurrent submission)
// is refused the same way.
func (b *Bus) StartRun(ctx context.Context, source string, rs toolbus.RunStarted) (err error) {
	// A refused publish ends the start at once, naming the grant (a client bound to
	// other identities), instead of waiting for the publish's timeout.
	ctx, done := b.Guard(ctx, SubjectPrefix+"."+rs.RunID+".")
	defer func() { err = done(err) }()
	if !toolbus.ValidRunID(rs.RunID) {
		return fmt.Errorf("events: invalid run id %q: use %s", rs.RunID, toolbus.IDShape)
	}
	if err := identityRefused("principal id", rs.Principal.ID); err != nil {
		return err
	}
	for _, t := range rs.AllowedTools {
		if !toolbus.ValidToolName(t) {
			return fmt.Errorf("events: invalid tool name %q in allowed tools", t)
		}
	}
	if rs.StartedAt.IsZero() {
		rs.StartedAt = time.Now().UTC()
	}
	e := RunStartedEvent(source, rs).Traced(traceparentOf(ctx))
	seq, err := b.publishFirstOfRun(ctx, e)
	switch {
	case err == nil && b.attestsFirst():
		return nil
	case err == nil:
		// A replicated stream checks the condition before its proposals are applied, so
		// a message still in flight on another subject of the run is not seen: read
		// which run.started is the first.
		return b.checkFirstRunStarted(ctx, rs.RunID, seq)
	case !errors.Is(err, errRunHasMessages):
		return streamFull(b.cfg.Stream, err)
	}
	if _, err := b.firstRunStarted(ctx, rs.RunID); err == nil {
		return fmt.Errorf("%w: %s", ErrRunExists, rs.RunID)
	} else if !errors.Is(err, ErrRunNotFound) {
		return err
	} else if b.client {
		// The run has events and none this identity may see: another's run.
		return fmt.Errorf("%w: %s", ErrRunExists, rs.RunID)
	}
	ack, err := b.PublishEvent(ctx, e)
	if err != nil {
		return err
	}
	if ack.Duplicate {
		return fmt.Errorf("%w: %s (submitted concurrently)", ErrRunExists, rs.RunID)
	}
	// A concurrent submission for another principal is on another subject, so the
	// stream stores both; only the first one starts the run.
	return b.checkFirstRunStarted(ctx, rs.RunID, ack.Sequence)
}

// checkFirstRunStarted returns ErrRunExists unless the run.started stored at seq is the
// run's first.
func (b *Bus) checkFirstRunStarted(ctx context.Context, run string, seq uint64) error {
	c, err := b.firstRunStarted(ctx, run)
	switch {
	case err == nil && c.seq != seq:
		return fmt.Errorf("%w: %s (submitted concurrently)", ErrRunExists, run)
	case b.client && errors.Is(err, ErrRunNotFound):
		// In a client account the read service shows a run only when its first
		// run.started names this identity: ours stored and none seen is another's first.
		return fmt.Errorf("%w: %s (submitted concurrently)", ErrRunExists, run)
	}
	return nil
}

// publishFirstOfRun publishes a run.started on condition that no message of its run is
// stored, and returns its sequence. errRunHasMessages when the condition failed, or the
// stream reported the id as a duplicate (taken by a message on another subject, as no
// message of the run exists).
func (b *Bus) publishFirstOfRun(ctx context.Context, e Envelope) (uint64, error) {
	msg, err := b.encode(ctx, e.Subject, e.Meta, e.Data)
	if err != nil {
		return 0, err
	}
	msg.Header.Set(headerExpectedLastSubjSeq, "0")
	msg.Header.Set(headerExpectedLastSubjSeqSubj, SubjectRun(e.Meta.RunID))
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(e.Meta.ID))
	switch {
	case wrongLastSequence(err):
		return 0, errRunHasMessages
	case err != nil:
		return 0, fmt.Errorf("events: publish %s: %w", e.Meta.ID, b.notBound(msg.Subject, err))
	case ack.Duplicate:
		return 0, errRunHasMessages
	}
	return ack.Sequence, nil
}

// attestsFirst reports whether a stored message that carries the condition of
// publishFirstOfRun was the first message of its run when the stream stored it: the
// stream checks such a condition atomically with the write when it has one replica and
// takes no batch publishes (a replicated stream, or a batch, checks it before earlier
// messages in flight are applied). Decided from the stream's configuration as read when
// the bus was opened.
func (b *Bus) attestsFirst() bool {
	c := b.stream.CachedInfo().Config
	return c.Replicas <= 1 && !c.AllowAtomicPublish && !c.AllowBatchPublish
}

// FirstOfRun reports whether the stream attests that the stored message with headers h
// was the first message of run: it carries the condition StartRun publishes a new run
// with (Nats-Expected-Last-Subject-Sequence 0 over toolbus.<run>.>, exactly once each),
// which the stream checked when it stored it (attestsFirst). Any publisher may send
// these headers, but the stream stores such a message only when the condition holds;
// a mirror or a source drops them.
func (b *Bus) FirstOfRun(h nats.Header, run string) bool {
	seq, subj := h.Values(headerExpectedLastSubjSeq), h.Values(headerExpectedLastSubjSeqSubj)
	return len(seq) == 1 && seq[0] == "0" && len(subj) == 1 && subj[0] == SubjectRun(run) && b.attestsFirst()
}

// StartedFirst takes a run.started a consumer received (its data, checked against its
// subject, stream sequence, stored time and headers) as the run's first without reading
// the stream, when the stream attests that it was the run's first message (FirstOfRun):
// it caches it for RunStarted and returns true. Otherwise it returns false and the
// caller reads (RunStartedSeq).
func (b *Bus) StartedFirst(rs toolbus.RunStarted, seq uint64, stored time.Time, h nats.Header) bool {
	if !b.FirstOfRun(h, rs.RunID) {
		return false
	}
	b.cacheRun(rs.RunID, cachedRun{rs: startedAt(&rs, stored), seq: seq, traceparent: h.Get(headerPrefix + ExtTraceParent)})
	return true
}

// startedAt returns rs with its start no later than the time the stream stored it: a
// run cannot start after the stream stored its start, and a client-chosen start in the
// future would push the deadline cap (MaxRunTimeout, from the start) with it.
func startedAt(rs *toolbus.RunStarted, stored time.Time) *toolbus.RunStarted {
	if !stored.IsZero() && (rs.StartedAt.IsZero() || rs.StartedAt.After(stored)) {
		rs.StartedAt = stored.UTC()
	}
	return rs
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
	c, err := b.firstRunStarted(ctx, run)
	if err != nil {
		return nil, 0, err
	}
	b.cacheRun(run, c)
	return c.rs, c.seq, nil
}

// RunTraceparent returns the W3C traceparent the first run.started of a run carries
// (its traceparent extension; empty when it carries none): the trace the run joins.
func (b *Bus) RunTraceparent(ctx context.Context, run string) (string, error) {
	if _, _, err := b.RunStartedAt(ctx, run); err != nil {
		return "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runCache[run].traceparent, nil
}

// cacheRun remembers the first run.started of a run: it never changes.
func (b *Bus) cacheRun(run string, c cachedRun) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.runCache) > 10000 {
		clear(b.runCache) // a bounded cache; entries are cheap to reload
	}
	b.runCache[run] = c
}

// RunStartedSeq returns the stream sequence of the first run.started of a run: the only
// one that starts it.
func (b *Bus) RunStartedSeq(ctx context.Context, run string) (uint64, error) {
	_, seq, err := b.RunStartedAt(ctx, run)
	return seq, err
}

// firstRunStarted reads the first run.started of the run's subjects (whatever principal
// they name) whose data names the run and the principal of its subject: a message there
// that is not a run.started of this run (a forgery whose body names another run or
// another principal, or no event at all) never starts it, and consumers terminate it.
func (b *Bus) firstRunStarted(ctx context.Context, run string) (cachedRun, error) {
	subject := SubjectRunStartedAny(run)
	for seq := uint64(1); ; {
		raw, err := getMsg(ctx, b.stream, seq, subject)
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return cachedRun{}, fmt.Errorf("%w: %s", ErrRunNotFound, run)
			}
			return cachedRun{}, fmt.Errorf("events: run.started of %s: %w", run, err)
		}
		seq = raw.Sequence + 1
		rs := new(toolbus.RunStarted)
		m, err := Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, rs)
		if err != nil || m.Type != TypeRunStarted || CheckSubject(raw.Subject, m, rs) != nil {
			continue
		}
		// A run cannot start after the stream stored its start: a client-chosen start in
		// the future would push the deadline cap (MaxRunTimeout, from the start) with it.
		if !raw.Time.IsZero() && (rs.StartedAt.IsZero() || rs.StartedAt.After(raw.Time)) {
			rs.StartedAt = raw.Time.UTC()
		}
		return cachedRun{rs: rs, seq: raw.Sequence, traceparent: m.TraceParent}, nil
	}
}

// EndRun records a run outcome and publishes run.<status>. It returns ErrRunEnded (and
// publishes nothing) when the run already ended differently, so a late result cannot
// move a run back. When the run already ended with the same outcome (a redelivery after
// a crash), the stored outcome is published again: its id is deterministic, and
// PublishOutcome skips it when the stream already has it.
func (b *Bus) EndRun(ctx context.Context, source string, step int, ended toolbus.RunEnded) error {
	st, err := b.state.RecordEnd(ctx, step, ended)
	if err != nil {
		return err
	}
	return b.PublishOutcome(ctx, source, st)
}

// PublishOutcome publishes the outcome event recorded in a run state (the second half of
// EndRun). It publishes nothing when the stream already holds that very event, so an
// outcome republished after a crash reaches the stream once even past the duplicate
// window. A terminal outcome (one per run: the run state records the first and never
// leaves it) is published on condition that its subject holds no message
// (Nats-Expected-Last-Subject-Sequence 0): the common case costs one publish; only
// when the subject holds a message (the outcome published before, or a forgery there)
// is it read, as a waiting_for_approval's always is (a run may wait several times).
func (b *Bus) PublishOutcome(ctx context.Context, source string, st store.RunState) error {
	ended := st.Ended
	if ended == nil {
		if !st.Status.Terminal() {
			return nil
		}
		// A state written before outcomes were stored whole: rebuild what it records.
		ended = &toolbus.RunEnded{RunID: st.RunID, Status: st.Status, Code: st.Code, Reason: st.Reason, StepsUsed: st.Step + 1}
	}
	e := RunEndedEvent(source, st.Step, *ended)
	if ended.Status.Terminal() {
		if err := b.publishOnEmptySubject(ctx, e); !errors.Is(err, errSubjectTaken) {
			return err
		}
	}
	if raw, err := getLastMsg(ctx, b.stream, e.Subject); err == nil && sameEvent(raw, e.Subject, e.Meta, 0) {
		return nil
	}
	_, err := b.PublishEvent(ctx, e)
	return err
}

// errSubjectTaken: an event published on condition that its subject is empty was not
// stored: the subject holds a message.
var errSubjectTaken = errors.New("events: the subject holds a message")

// publishOnEmptySubject publishes e on condition that its subject holds no message;
// errSubjectTaken when it does. A duplicate acknowledgement (its id taken on another
// subject, as its own is empty) is settled as every publish's is.
func (b *Bus) publishOnEmptySubject(ctx context.Context, e Envelope) error {
	msg, err := b.encode(ctx, e.Subject, e.Meta, e.Data)
	if err != nil {
		return err
	}
	msg.Header.Set(headerExpectedLastSubjSeq, "0")
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(e.Meta.ID))
	switch {
	case wrongLastSequence(err):
		return errSubjectTaken
	case err != nil:
		return fmt.Errorf("events: publish %s: %w", e.Meta.ID, writeRefusal(err))
	case ack.Duplicate:
		_, err = b.settleDuplicate(ctx, msg, ack)
		return err
	}
	return nil
}

// PublishApproval publishes a person's (or a service's) decision on a call that waits
// for approval: toolbus.<run>.approval.granted or .denied, with the step in the step
// extension and the id <run>/<step>/<call_id>/approval.<granted|denied>, so the same
// decision published twice is stored once. The injector records the first decision
// per call and re-issues the call.
func (b *Bus) PublishApproval(ctx context.Context, source string, step int, a toolbus.Approval, granted bool) (*jetstream.PubAck, error) {
	if !toolbus.ValidRunID(a.RunID) || a.CallID == "" {
		return nil, fmt.Errorf("events: approval needs a valid run id and a call id")
	}
	if err := identityRefused("approver", a.Who); err != nil {
		return nil, err
	}
	if err := DecisionSize(a); err != nil {
		return nil, err
	}
	ctx, done := b.Guard(ctx, SubjectPrefix+"."+a.RunID+".")
	ack, err := b.PublishEvent(ctx, ApprovalEvent(source, step, a, granted))
	return ack, done(err)
}

// PublishCancel publishes run.cancel: executors cancel the run's calls in flight and the
// injector ends the run as cancelled.
func (b *Bus) PublishCancel(ctx context.Context, source string, c toolbus.Cancel) (*jetstream.PubAck, error) {
	if !toolbus.ValidRunID(c.RunID) {
		return nil, fmt.Errorf("events: cancel needs a valid run id")
	}
	if err := identityRefused("canceller", c.Who); err != nil {
		return nil, err
	}
	if err := DecisionSize(c); err != nil {
		return nil, err
	}
	ctx, done := b.Guard(ctx, SubjectPrefix+"."+c.RunID+".")
	ack, err := b.PublishEvent(ctx, CancelEvent(source, c))
	return ack, done(err)
}

// MaxDecisionBytes bounds the data of an approval, denial or cancel (JSON bytes): a
// larger one is refused by PublishApproval and PublishCancel, and terminated unapplied
// by the injector.
const MaxDecisionBytes = 64 << 10

// DecisionSize refuses a decision (toolbus.Approval or toolbus.Cancel) whose data is
// over MaxDecisionBytes, naming its size.
func DecisionSize(d any) error {
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("events: decision: %w", err)
	}
	if len(b) > MaxDecisionBytes {
		return fmt.Errorf("%w: a decision of %d bytes is over the bound of %d (events.MaxDecisionBytes): shorten its reason, answer or arguments",
			ErrPoison, len(b), MaxDecisionBytes)
	}
	return nil
}
