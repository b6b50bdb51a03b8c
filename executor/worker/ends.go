package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// endedRuns is what a worker learns of ended runs from their outcome events
// (toolbus.<run>.run.<terminal status>, core NATS subscriptions), so that checking
// whether a call's run already ended costs no read of the run state per call.
//
// A subscription only hears what is published while it listens. The worker therefore
// trusts it only for runs that started while it listened: it records the stream's last
// sequence once its subscriptions are in place (from), and a run whose first run.started
// has a higher sequence started afterwards, so every outcome of that run reached the
// worker (an outcome is published after its run.started). For any other run, and
// whenever the subscriptions may have missed a message (a reconnection, a slow-consumer
// drop, the map emptied to bound it), the run state is read as before, until a new
// sequence is recorded.
type endedRuns struct {
	nc   *nats.Conn
	info func(context.Context) (uint64, error) // the stream's last sequence

	mu         sync.Mutex
	ended      map[string]toolbus.RunStatus
	subs       []*nats.Subscription
	from       uint64 // 0: the subscriptions are not trusted
	reconnects uint64 // the connection's reconnections when from was recorded
	dropped    int    // messages the subscriptions dropped when from was recorded
	refreshing bool
	lastTry    time.Time
}

// terminalStatuses are the outcomes after which a run takes no more calls.
var terminalStatuses = []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled}

// errNoOutcomeSubscription: the credentials may not subscribe to outcome events (a
// deployment whose permissions predate them); the worker reads the run state instead.
var errNoOutcomeSubscription = errors.New("executor: no permission to subscribe to run outcomes")

// listen subscribes to the outcome events and records the sequence from which they are
// trusted. An error leaves the worker reading run states, as before the subscriptions.
func (e *endedRuns) listen(ctx context.Context) error {
	for _, st := range terminalStatuses {
		status := st
		sub, err := e.nc.Subscribe(events.SubjectRunEnded("*", status), func(m *nats.Msg) {
			// Only an outcome whose body agrees with its subject ends a run.
			if run, typ, err := events.CheckMsg(m); err == nil && typ == events.TypeRunEnded(status) {
				e.mu.Lock()
				if len(e.ended) >= 100000 {
					clear(e.ended) // bounded: forgotten runs are read from the store again
					e.from = 0
				}
				e.ended[run] = status
				e.mu.Unlock()
			}
		})
		if err != nil {
			return fmt.Errorf("executor: subscribe to run outcomes: %w", err)
		}
		e.mu.Lock()
		e.subs = append(e.subs, sub)
		e.mu.Unlock()
	}
	return e.refresh(ctx)
}

// close removes the subscriptions.
func (e *endedRuns) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.subs {
		_ = s.Unsubscribe() // the connection may be closing
	}
	e.subs = nil
	e.from = 0
}

// refresh records the sequence from which the subscriptions are trusted: the stream's
// last sequence, read once the server has every subscription.
func (e *endedRuns) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reconnects := e.nc.Stats().Reconnects
	if err := e.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("executor: flush outcome subscriptions: %w", err)
	}
	// A refused subscription is reported asynchronously, before the flush's answer.
	if err := e.nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) &&
		strings.Contains(err.Error(), "."+string(toolbus.RunCompleted)) {
		return fmt.Errorf("%w: %w", errNoOutcomeSubscription, err)
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
	e.from, e.reconnects, e.dropped = seq, reconnects, dropped
	return nil
}

func (e *endedRuns) droppedNow() int {
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

// lookup returns the outcome of a run whose first run.started has sequence startSeq,
// and whether the subscriptions answer for it; when they do not, the caller reads the
// run state.
func (e *endedRuns) lookup(run string, startSeq uint64) (toolbus.RunStatus, bool) {
	e.mu.Lock()
	status, ok := e.ended[run]
	from, reconnects, dropped := e.from, e.reconnects, e.dropped
	e.mu.Unlock()
	if ok {
		return status, true
	}
	if from > 0 && e.nc.Stats().Reconnects == reconnects && e.droppedNow() == dropped {
		return "", startSeq > from
	}
	// Not trusted yet, or messages may have been lost: read the run state until a new
	// sequence is recorded.
	e.mu.Lock()
	if e.from == from {
		e.from = 0
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
