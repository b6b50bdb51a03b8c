package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
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
	sub, err := w.bus.Conn().Subscribe(events.FilterRunCancel, func(m *nats.Msg) { w.onCancel(ctx, m) })
	if err != nil {
		return nil, fmt.Errorf("executor: subscribe to cancellations: %w", err)
	}
	subs = append(subs, sub)
	// A run the core ended otherwise than completed (a cancel the injector accepted from
	// a decider the run does not name, TOOLBUS_DECIDERS) ends its calls here too.
	// (Later calls of an ended run are refused when they start: runEnded.)
	w.ends.OnEnded(func(run string, status toolbus.RunStatus) {
		if status != toolbus.RunCompleted && w.runsCallsOf(run) {
			w.cancelRun(run)
		}
	})
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

// onCancel cancels the calls of a run at once on a run.cancel by the run's principal
// or one of its approvers (its first run.started names them: the rule of the injector's
// decision policy and of every read). Anyone may publish a run.cancel on their own
// subject, naming any run: a cancel by someone else (which the injector refuses unless
// its TOOLBUS_DECIDERS lists them) cancels nothing here; accepted, it ends the run,
// whose outcome cancels the calls (followCancels).
func (w *Worker) onCancel(ctx context.Context, m *nats.Msg) {
	// The run the subject names, once the body agrees: the injector terminates a cancel
	// whose body names another run, and nothing may act on it here either.
	run, who, ok := events.CancelOf(m)
	if !ok {
		w.log.Warn("run.cancel ignored: not a cancel of the run its subject names", "subject", m.Subject)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rs, err := w.bus.RunStarted(ctx, run)
		if err != nil || !rs.NamesDecider(who) {
			w.log.Warn("run.cancel not applied here: its actor is neither the run's principal nor an approver (the injector decides; an end of the run reaches the calls)",
				"run_id", run, "who", who, "error", err)
			return
		}
		w.cancelRun(run)
	}()
}

// runsCallsOf reports whether calls of run are in flight here.
func (w *Worker) runsCallsOf(run string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.inflight[run]) > 0
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
