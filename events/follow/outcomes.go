package follow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// RunOutcomes is what a worker learns of ended runs from their outcome events
// (toolbus.<run>.run.<terminal status>, core NATS subscriptions), so that checking
// whether a run already ended costs no read of the run state each time (an executor per
// call, the injector per step).
//
// A subscription only hears what is published while it listens. A worker therefore
// trusts it only for runs that started while it listened: it records the stream's last
// sequence once its subscriptions are in place (from), and a run whose first run.started
// has a higher sequence started afterwards, so every outcome of that run reached the
// worker (an outcome is published after its run.started). For any other run, and
// whenever the subscriptions may have missed a message (a reconnection, a slow-consumer
// drop, the map emptied to bound it), the run state is read as before, until a new
// sequence is recorded.
type RunOutcomes struct {
	nc   *nats.Conn
	info func(context.Context) (uint64, error) // the stream's last sequence
	// states, when set, is the subject of the run states' writes ($KV.<runs bucket>.>),
	// followed too (FollowRunStates) by stateSub, whose handler counts what it handled.
	states       string
	stateSub     *nats.Subscription
	stateHandled atomic.Uint64
	stateHook    func(run string) // tests: called before a write is recorded
	// handledMu guards handledCh, closed (and dropped) when a write was handled while a
	// lookup waited for the writes received before it (statesCaughtUp).
	handledMu sync.Mutex
	handledCh chan struct{}
	catchUp   time.Duration // statesCatchUp; tests change it
	// onEnded, when set (OnEnded), is called with each end once it is recorded.
	onEnded func(run string, status toolbus.RunStatus)

	mu    sync.Mutex
	ended map[string]toolbus.RunStatus
	subs  []*nats.Subscription
	// trusted: the subscriptions answer for runs whose first run.started is after from
	// (the stream's last sequence when they were in place: 0 on an empty stream).
	trusted    bool
	from       uint64
	epoch      uint64 // counts the recorded froms, so that a lookup distrusts only the one it saw
	reconnects uint64 // the connection's reconnections when from was recorded
	dropped    int    // messages the subscriptions dropped when from was recorded
	refreshing bool
	lastTry    time.Time
}

// terminalOutcomes are the outcomes after which a run takes no more calls.
var terminalOutcomes = []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled}

// ErrNoOutcomeSubscription: the credentials may not subscribe to outcome events (a
// deployment whose permissions predate them); the worker reads the run state instead.
var ErrNoOutcomeSubscription = errors.New("events: no permission to subscribe to run outcomes")

// NewRunOutcomes returns the outcome follower of a connection; lastSeq returns the event
// stream's last sequence. It follows nothing until Listen.
func NewRunOutcomes(nc *nats.Conn, lastSeq func(context.Context) (uint64, error)) *RunOutcomes {
	return &RunOutcomes{nc: nc, info: lastSeq, ended: map[string]toolbus.RunStatus{}, catchUp: statesCatchUp}
}

// Outcomes returns the outcome follower of the bus's connection.
func Outcomes(b *events.Bus) *RunOutcomes {
	return NewRunOutcomes(b.Conn(), func(ctx context.Context) (uint64, error) {
		si, err := b.EventStream().Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("events: stream info: %w", err)
		}
		return si.State.LastSeq, nil
	})
}

// FollowRunStates makes Listen follow the writes of the run states as well (core NATS,
// $KV.<runs bucket>.>): an end is then known from the write that records it, before its
// outcome event is published, and even when a crash between the two loses the event.
// That closes the one gap of the outcome events (see Lookup), so a worker that must not
// act on an ended run (the planner, before calling the model) can trust the follower as
// it would a read of the run state. Call it before Listen.
//
// A core subscription sees every write the server lets through, including a
// compare-and-set the bucket then refuses. Only the planner and the injector may write
// run states, and they write a terminal state only to end the run: a refused write is
// retried until the run has ended (Store.RecordEnd; the retry of a writer that crashed
// comes with the redelivery of what it was handling), so a terminal write seen means
// the run has ended or is being ended.
func (e *RunOutcomes) FollowRunStates() {
	e.states = store.KeySubject(store.BucketRuns, ">")
}

// Listen subscribes to the outcome events (and the run states' writes, see
// FollowRunStates) and records the sequence from which they are trusted. An error
// leaves the worker reading run states, as before the subscriptions (call Close).
func (e *RunOutcomes) Listen(ctx context.Context) error {
	for _, st := range terminalOutcomes {
		status := st
		sub, err := e.nc.Subscribe(events.SubjectRunEnded("*", status), func(m *nats.Msg) {
			// Only an outcome whose body agrees with its subject ends a run.
			if run, typ, err := events.CheckMsg(m); err == nil && typ == events.TypeRunEnded(status) {
				e.record(run, status)
			}
		})
		if err != nil {
			return fmt.Errorf("events: subscribe to run outcomes: %w", err)
		}
		e.mu.Lock()
		e.subs = append(e.subs, sub)
		e.mu.Unlock()
	}
	if e.states != "" {
		sub, err := e.nc.Subscribe(e.states, func(m *nats.Msg) {
			e.stateWritten(m)
			e.stateHandled.Add(1)
			e.handledMu.Lock()
			if e.handledCh != nil {
				close(e.handledCh)
				e.handledCh = nil
			}
			e.handledMu.Unlock()
		})
		if err != nil {
			return fmt.Errorf("events: subscribe to run states: %w", err)
		}
		e.mu.Lock()
		e.subs, e.stateSub = append(e.subs, sub), sub
		e.mu.Unlock()
	}
	return e.refresh(ctx)
}

// stateWritten records the end a run-state write records. Deletes and purges (the
// KV-Operation header) and bodies that name another run than their key are ignored.
func (e *RunOutcomes) stateWritten(m *nats.Msg) {
	if m.Header.Get("KV-Operation") != "" {
		return
	}
	run := strings.TrimPrefix(m.Subject, strings.TrimSuffix(e.states, ">"))
	var st struct {
		RunID  string            `json:"run_id"`
		Status toolbus.RunStatus `json:"status"`
	}
	if !toolbus.ValidRunID(run) || json.Unmarshal(m.Data, &st) != nil || st.RunID != run || !st.Status.Terminal() {
		return
	}
	if e.stateHook != nil {
		e.stateHook(run)
	}
	e.record(run, st.Status)
}

// record notes that run ended with status, then tells the OnEnded function.
func (e *RunOutcomes) record(run string, status toolbus.RunStatus) {
	e.mu.Lock()
	if len(e.ended) >= 100000 {
		clear(e.ended) // bounded: forgotten runs are read from the store again
		e.trusted = false
	}
	e.ended[run] = status
	e.mu.Unlock()
	if e.onEnded != nil {
		e.onEnded(run, status)
	}
}

// OnEnded sets a function called with each run end the follower hears, after Lookup
// answers with it: whoever records something of a run and then looks the run up is
// either answered with the end or called with it afterwards, never neither (one
// subscription of its own could hear the end before this follower records it). Set it
// before Listen.
func (e *RunOutcomes) OnEnded(f func(run string, status toolbus.RunStatus)) { e.onEnded = f }

// Close removes the subscriptions.
func (e *RunOutcomes) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.subs {
		_ = s.Unsubscribe() // the connection may be closing
	}
	e.subs, e.stateSub = nil, nil
	e.trusted = false
}

// refresh records the sequence from which the subscriptions are trusted: the stream's
// last sequence, read once the server has every subscription.
func (e *RunOutcomes) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reconnects := e.nc.Stats().Reconnects
	if err := e.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("events: flush outcome subscriptions: %w", err)
	}
	if err := connect.SubscribeRefused(e.nc, e.subjects()...); err != nil {
		return fmt.Errorf("%w: %w", ErrNoOutcomeSubscription, err)
	}
	seq, err := e.info(ctx)
	if err != nil {
		return err
	}
	dropped := e.droppedNow()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.subs) == 0 || e.nc.Stats().Reconnects != reconnects {
		return nil // closed, or reconnected meanwhile: the next call tries again
	}
	e.trusted, e.from, e.reconnects, e.dropped = true, seq, reconnects, dropped
	e.epoch++
	return nil
}

// statesCaughtUp reports whether every run-state write the connection had received
// when it was called has been handled (true when run states are not followed), waiting
// up to statesCatchUp for the handler to get there. One
// server sends this connection what it handles in the order it handles it, so once this
// holds, an end written before the server delivered the step being checked (on the same
// connection) is in the map. Across a cluster the write and the delivery may take
// different routes: an end written within that latency of the delivery may be missed,
// as a read of the run state just before the write would miss it. Pending is read first: a write not pending then had been delivered to the
// handler, so it is counted by Delivered, read next, and handled once the count of
// handled writes, read last, reaches it.
func (e *RunOutcomes) statesCaughtUp() bool {
	e.mu.Lock()
	sub := e.stateSub
	e.mu.Unlock()
	if sub == nil {
		return true
	}
	// The writes received so far are at most those handed to the handler and those
	// still counted pending (the one in the handler is counted by both until it returns).
	n, _, err := sub.Pending()
	if err != nil {
		return false
	}
	d, err := sub.Delivered()
	if err != nil {
		return false
	}
	upper := uint64(d) + uint64(n)
	// caught reports whether the writes received before the call are handled: as many as
	// that bound, or none pending now and all handed over handled.
	caught := func() bool {
		if e.stateHandled.Load() >= upper {
			return true
		}
		n, _, err := sub.Pending()
		if err != nil || n > 0 {
			return false
		}
		d, err := sub.Delivered()
		return err == nil && e.stateHandled.Load() >= uint64(d)
	}
	if caught() {
		return true
	}
	// The step being checked came right behind its run's latest write (a step is asked
	// for after its run state is written): waiting for the handler, a matter of
	// microseconds, is cheaper than a read of the run state. The handler says when it
	// handled a write; the subscription counts it out of pending only after the handler
	// returns, hence the short polls too.
	deadline := time.Now().Add(e.catchUp)
	poll := time.NewTicker(100 * time.Microsecond)
	defer poll.Stop()
	for time.Now().Before(deadline) {
		e.handledMu.Lock()
		if e.handledCh == nil {
			e.handledCh = make(chan struct{})
		}
		handled := e.handledCh
		e.handledMu.Unlock()
		if caught() {
			return true
		}
		select {
		case <-handled:
		case <-poll.C:
		}
	}
	return caught()
}

// statesCatchUp bounds how long a lookup waits for the run-state writes received before
// it to be handled; past it, the caller reads the run state.
const statesCatchUp = 5 * time.Millisecond

// subjects returns the subjects of the follower's subscriptions.
func (e *RunOutcomes) subjects() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, 0, len(e.subs))
	for _, s := range e.subs {
		out = append(out, s.Subject)
	}
	return out
}

func (e *RunOutcomes) droppedNow() int {
	e.mu.Lock()
	subs := e.subs
	e.mu.Unlock()
	n := 0
	for _, s := range subs {
		if d, err := s.Dropped(); err == nil {
			n += d
		}
	}
	return n
}

// Lookup returns the outcome of a run whose first run.started has sequence startSeq
// ("" while it has not ended), and whether the subscriptions answer for it; when they
// do not, the caller reads the run state. An outcome recorded in the run state but not
// published yet (a crash between the two) is not seen: callers for whom that matters
// read the run state.
func (e *RunOutcomes) Lookup(run string, startSeq uint64) (toolbus.RunStatus, bool) {
	e.mu.Lock()
	status, ok := e.ended[run]
	trusted, from, epoch, reconnects, dropped := e.trusted, e.from, e.epoch, e.reconnects, e.dropped
	e.mu.Unlock()
	if ok {
		return status, true
	}
	if trusted && e.nc.Stats().Reconnects == reconnects && e.droppedNow() == dropped {
		// A write received but not handled yet could be the run's end: not an answer
		// (the caller reads), but no reason to distrust the subscriptions either.
		if startSeq <= from || !e.statesCaughtUp() {
			return "", false
		}
		e.mu.Lock()
		status = e.ended[run] // the writes just handled may have ended it
		e.mu.Unlock()
		return status, true
	}
	// Not trusted yet, or messages may have been lost: read the run state until a new
	// sequence is recorded.
	e.mu.Lock()
	if e.epoch == epoch {
		e.trusted = false
	}
	start := !e.refreshing && len(e.subs) > 0 && time.Since(e.lastTry) > time.Second
	if start {
		e.refreshing, e.lastTry = true, time.Now()
	}
	e.mu.Unlock()
	if start {
		go func() {
			_ = e.refresh(context.Background()) // on failure the next lookup tries again
			e.mu.Lock()
			e.refreshing = false
			e.mu.Unlock()
		}()
	}
	return "", false
}
