package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
)

// followCancels subscribes to what ends the runs of calls in flight: run.cancel and the
// run outcomes, or, in a team account, which hears neither, the core's notices that a
// run ended for the served tools (events.SubjectRunEndedFor).
func (w *Worker) followCancels(ctx context.Context, served []string) (stop func(), err error) {
	var subs []*nats.Subscription
	stop = func() {
		for _, s := range subs {
			_ = s.Unsubscribe() // the connection may be closing
		}
		w.ends.Close()
	}
	if w.bus.TeamAccount() {
		w.ends.Close()
		for _, tool := range served {
			sub, err := w.bus.Conn().Subscribe(events.FilterRunEndedFor(tool), w.onEndNotice)
			if err != nil {
				stop()
				return nil, fmt.Errorf("executor: subscribe to the run-ended notices of %s: %w", tool, err)
			}
			subs = append(subs, sub)
		}
		return stop, nil
	}
	sub, err := w.bus.Conn().Subscribe(events.FilterRunCancel, w.onCancel)
	if err != nil {
		return nil, fmt.Errorf("executor: subscribe to cancellations: %w", err)
	}
	subs = append(subs, sub)
	if err := w.ends.Listen(ctx); err != nil {
		// Without them every call reads its run's state, as it always may.
		w.ends.Close()
		w.log.Warn("run outcomes not followed: each call reads its run's state (give the executor's credentials subscribe permission on toolbus.*.run.<outcome>)", "error", err)
	}
	return stop, nil
}

// onEndNotice cancels the calls of a run the core says ended (team accounts).
func (w *Worker) onEndNotice(m *nats.Msg) {
	var n events.RunEndedNotice
	run, ok := events.RunIDFromSubject(strings.Replace(m.Subject, events.NoticePrefix+".", events.SubjectPrefix+".", 1))
	if err := json.Unmarshal(m.Data, &n); err != nil || !ok || n.RunID != run {
		w.log.Warn("run-ended notice ignored: not a notice of the run its subject names", "subject", m.Subject)
		return
	}
	w.cancelRun(run)
}

func (w *Worker) onCancel(m *nats.Msg) {
	// The run the subject names, once the body agrees: the injector terminates a cancel
	// whose body names another run, and nothing may act on it here either.
	run, ok := events.CancelOf(m)
	if !ok {
		w.log.Warn("run.cancel ignored: not a cancel of the run its subject names", "subject", m.Subject)
		return
	}
	w.cancelRun(run)
}

// cancelRun cancels the calls of run in flight here and those that start later.
func (w *Worker) cancelRun(run string) {
	w.mu.Lock()
	if len(w.cancelled) > 100000 {
		clear(w.cancelled)
	}
	w.cancelled[run] = time.Now()
	n := 0
	for h := range w.inflight[run] {
		h.cancel(errRunCancelled)
		n++
	}
	w.mu.Unlock()
	w.log.Info("run cancelled", "run_id", run, "calls_cancelled", n)
}
