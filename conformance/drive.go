package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// requestAll publishes every case, the poison message and the call whose subject and
// data name different runs.
func (s *suite) requestAll() error {
	ctx, bus, tool := s.ctx, s.bus, s.cfg.Tool
	long := 2*s.cfg.AckWait + s.cfg.AckWait/2
	s.calls = []call{
		{name: "valid", args: `{"ms":1}`, wantStatus: toolbus.StatusSucceeded},
		{name: "malformed", args: `{"ms":`, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeInvalidArguments},
		{name: "not_an_object", args: `[1]`, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeInvalidArguments},
		{name: "schema_violation", args: `{"ms":"soon"}`, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeInvalidArguments},
		{name: "unknown_argument", args: `{"ms":1,"bogus":true}`, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeInvalidArguments},
		{name: "not_allowed", args: `{"ms":1}`, allowed: []string{"some_other_tool"}, wantStatus: toolbus.StatusRejected, wantCode: toolbus.CodeNotAuthorized},
		{name: "deadline", args: `{"ms":600000}`, deadline: time.Now().Add(time.Second), wantStatus: toolbus.StatusTimedOut, wantCode: toolbus.CodeTimeout},
		{name: "cancel", args: `{"ms":600000}`, cancel: true, wantStatus: toolbus.StatusCancelled, wantCode: toolbus.CodeCancelled},
		{name: "long", args: fmt.Sprintf(`{"ms":%d}`, long.Milliseconds()), long: true, wantStatus: toolbus.StatusSucceeded},
		{name: "squatted", args: `{"ms":1}`, squat: true, wantStatus: toolbus.StatusSucceeded},
		{name: "forged_cancel", args: `{"ms":3000}`, forgedCancel: true, wantStatus: toolbus.StatusSucceeded},
		{name: "run_ended", args: `{"ms":1}`, ended: true, wantStatus: toolbus.StatusCancelled, wantCode: toolbus.CodeRunEnded},
		{name: "taken_over", args: `{"ms":1}`, claimedBy: claimedGone, wantStatus: toolbus.StatusSucceeded, wantAttempt: 2},
		{name: "held", args: `{"ms":1}`, claimedBy: claimedHolder, wantStatus: toolbus.StatusSucceeded, wantAttempt: 2},
	}
	if s.cfg.Accounts {
		s.calls = slices.DeleteFunc(s.calls, func(c call) bool { return c.squat })
		for i := range s.calls {
			if s.calls[i].ended {
				// The run's end reaches a team account as the core's notice, which cancels.
				s.calls[i].wantCode = toolbus.CodeCancelled
			}
		}
	}
	s.heldSince = time.Now()
	for _, c := range s.calls {
		if err := request(ctx, bus, s.runOf(c), tool, c, func() error { return s.prepare(c) }); err != nil {
			return err
		}
	}
	// Poison: not a CloudEvent, on the tool's queue. The executor terminates it and goes on.
	if _, err := bus.JetStream().Publish(ctx, events.SubjectToolRequested(s.poisonRun(), tool), []byte("not json at all")); err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	// Subject and body disagree: a call on this run's subject whose data names another
	// (started) run. The executor must run nothing and publish no result for either.
	mismatch := s.mismatchRuns()
	for _, run := range mismatch {
		if err := bus.StartRun(ctx, events.Source("conformance", "suite"), toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: "conformance"}}); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
	}
	forgedCall := events.ToolRequestedEvent(events.Source("planner", "conformance"), toolbus.ToolRequested{RunID: mismatch[1], Step: 0,
		CallIndex: 0, CallCount: 1, Call: toolbus.ToolCall{CallID: "mismatch", Tool: tool, Arguments: `{"ms":1}`}}, true)
	if _, err := bus.Publish(ctx, events.SubjectToolRequested(mismatch[0], tool), forgedCall.Meta, forgedCall.Data); err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	return nil
}

// prepare records what a case needs before its call, once its run started: the run
// ended (its outcome published, as the planner does, and its run state), or the call
// claimed by another executor (gone, or alive until releaseHeld).
func (s *suite) prepare(c call) error {
	ctx, run := s.ctx, s.runOf(c)
	if c.ended {
		kv, err := s.bus.JetStream().KeyValue(ctx, store.BucketRuns)
		if err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
		now := time.Now().UTC()
		outcome := toolbus.RunEnded{RunID: run, Status: toolbus.RunCompleted, Answer: "done"}
		if s.cfg.Accounts {
			// The core sends its notice for a run that ended otherwise than completed
			// (its calls may still run): the run failed, as when the model API refuses.
			outcome = toolbus.RunEnded{RunID: run, Status: toolbus.RunFailed, Reason: "conformance: the model refused", Code: toolbus.CodeModelError}
		}
		state, _ := json.Marshal(store.RunState{RunID: run, Status: outcome.Status, StartedAt: now, UpdatedAt: now})
		if _, err := kv.Put(ctx, run, state); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
		ended := events.RunEndedEvent(events.Source("planner", "conformance"), 0, outcome)
		if _, err := s.bus.PublishEvent(ctx, ended); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
		if s.cfg.Accounts {
			if err := s.notifyEnded(run, run, outcome.Status); err != nil {
				return err
			}
		}
	}
	if c.claimedBy == "" {
		return nil
	}
	holder := store.Claim{Team: s.cfg.Team, Instance: "conformance-gone-" + s.stamp, Boot: "b0", Attempt: 1, At: time.Now().UTC()}
	if c.claimedBy == claimedHolder {
		holder.Instance, holder.Boot = holderName(s), holderBoot
		now := time.Now().UTC()
		if _, err := s.bus.Store().PutInstance(ctx, store.Instance{Team: s.cfg.Team, Name: holder.Instance, Boot: holderBoot, Tools: []string{"conformance-holder"},
			Concurrency: 1, StartedAt: now, HeartbeatAt: now}); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
		// Renewed until releaseHeld stops the renewals and removes it (the bucket would
		// forget it one TTL after the last write).
		s.holderStop, s.holderDone = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(s.holderDone)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-s.holderStop:
					return
				case <-ctx.Done():
					return
				case <-t.C:
				}
				now := time.Now().UTC()
				_, _ = s.bus.Store().PutInstance(ctx, store.Instance{Team: s.cfg.Team, Name: holder.Instance, Boot: holderBoot, Tools: []string{"conformance-holder"},
					Concurrency: 1, StartedAt: now, HeartbeatAt: now})
			}
		}()
	}
	if _, _, err := s.bus.Store().ClaimCall(ctx, events.ToolToken(s.cfg.Tool), run, 0, c.name, holder); err != nil {
		return fmt.Errorf("conformance: claim %s: %w", c.name, err)
	}
	return nil
}

// cancelClaimed cancels the cancel case once it is claimed, and publishes the forged
// cancellation of the forged_cancel case once it is.
func (s *suite) cancelClaimed() error {
	ctx, bus := s.ctx, s.bus
	for _, c := range s.calls {
		if !c.cancel && !c.forgedCancel {
			continue
		}
		run := s.runOf(c)
		if err := poll(ctx, func() error { return claimed(ctx, bus, s.cfg.Tool, run, c.name) }); err != nil {
			s.fail("%s: the call was never claimed, so it never ran: %v", c.name, err)
			continue
		}
		if c.forgedCancel {
			elsewhere := "conf-" + s.stamp + "-elsewhere"
			if s.cfg.Accounts {
				// The notice on the call's run whose body names another run.
				if err := s.notifyEnded(run, elsewhere, toolbus.RunCancelled); err != nil {
					return err
				}
				continue
			}
			forged := events.CancelEvent(events.Source("conformance", "suite"), toolbus.Cancel{RunID: elsewhere, Reason: "forged"})
			if _, err := bus.Publish(ctx, events.SubjectRunCancel(run, ""), forged.Meta, forged.Data); err != nil {
				return err
			}
			continue
		}
		// By the run's principal: an executor acts at once only on a cancel whose author
		// the run's run.started names (principal or approver); another's waits for the end.
		if _, err := bus.PublishCancel(ctx, events.Source("conformance", "suite"), toolbus.Cancel{RunID: run, Reason: "conformance", Who: "conformance"}); err != nil {
			return err
		}
		if s.cfg.Accounts {
			// What the injector does on the cancel: the core's notice to the tool's executors.
			if err := s.notifyEnded(run, run, toolbus.RunCancelled); err != nil {
				return err
			}
		}
	}
	return nil
}

// releaseHeld checks that the call claimed by a live executor is left alone for two ack
// waits (no result), then removes that executor's instance record: the call must then be
// taken over.
func (s *suite) releaseHeld() error {
	for _, c := range s.calls {
		if c.claimedBy != claimedHolder {
			continue
		}
		run := s.runOf(c)
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case <-time.After(time.Until(s.heldSince.Add(2 * s.cfg.AckWait))):
		}
		if n, err := countStored(s.ctx, s.bus, run); err != nil {
			return err
		} else if n > 0 {
			s.fail("%s: the call ran while the executor that claimed it was alive (its claim's instance record was live)", c.name)
		}
		close(s.holderStop)
		<-s.holderDone // no renewal after the removal
		if err := s.bus.Store().DeleteInstance(s.ctx, s.cfg.Team, holderName(s), holderBoot); err != nil {
			return fmt.Errorf("conformance: %w", err)
		}
	}
	return nil
}

// notifyEnded publishes, as the core (the injector), the notice that run ended for the
// tool under test (events.SubjectRunEndedFor), whose body names body; it returns once the
// server has it, so a call published after it reaches the executor after it.
func (s *suite) notifyEnded(run, body string, status toolbus.RunStatus) error {
	b, err := json.Marshal(events.RunEndedNotice{RunID: body, Status: status})
	if err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	nc := s.bus.Conn()
	if err := nc.Publish(events.SubjectRunEndedFor(run, s.cfg.Tool), b); err != nil {
		return fmt.Errorf("conformance: run-ended notice: %w", err)
	}
	if err := nc.FlushWithContext(s.ctx); err != nil {
		return fmt.Errorf("conformance: run-ended notice: %w", err)
	}
	return nil
}

func holderName(s *suite) string { return "conformance-holder-" + s.stamp }

// sample reads the tool's queue, keeping the most redeliveries seen.
func (s *suite) sample() (events.ToolQueue, error) {
	q, err := s.bus.ToolQueueInfo(s.ctx, s.cfg.Tool)
	if err == nil {
		s.redelivered = max(s.redelivered, q.Redelivers)
	}
	return q, err
}

// request starts a run and publishes its one call, as client and planner do; before,
// when set, runs between the two.
func request(ctx context.Context, bus *events.Bus, run, tool string, c call, before func() error) error {
	rs := toolbus.RunStarted{RunID: run, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "conformance " + c.name}},
		AllowedTools: c.allowed, Limits: toolbus.Limits{Deadline: c.deadline}, Principal: toolbus.Principal{ID: "conformance"}}
	if err := bus.StartRun(ctx, events.Source("conformance", "suite"), rs); err != nil {
		return fmt.Errorf("conformance: start run %s: %w", run, err)
	}
	if c.squat {
		// What any party allowed to publish on another run's run.started may do.
		id := events.IDToolFinished(run, 0, c.name)
		m := nats.NewMsg(events.SubjectRunStarted(run+"-decoy", "conformance"))
		m.Data = []byte("squat " + id)
		if _, err := bus.JetStream().PublishMsg(ctx, m, jetstream.WithMsgID(id)); err != nil {
			return fmt.Errorf("conformance: squat %s: %w", id, err)
		}
	}
	if before != nil {
		if err := before(); err != nil {
			return err
		}
	}
	tc := toolbus.ToolCall{CallID: c.name, Tool: tool, Arguments: c.args}
	_, err := bus.PublishEvent(ctx, events.ToolRequestedEvent(events.Source("planner", "conformance"),
		toolbus.ToolRequested{RunID: run, Step: 0, CallIndex: 0, CallCount: 1, Call: tc, Deadline: c.deadline,
			Principal: rs.Principal, AllowedTools: c.allowed}, true).
		Traced("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	if err != nil {
		return fmt.Errorf("conformance: request %s: %w", c.name, err)
	}
	return nil
}

// claimed reports (as nil) whether the executor claimed the call in the claims bucket.
func claimed(ctx context.Context, bus *events.Bus, tool, run, callID string) error {
	kv, err := bus.JetStream().KeyValue(ctx, store.BucketClaims)
	if err != nil {
		return err
	}
	_, err = kv.Get(ctx, store.ClaimKey(events.ToolToken(tool), run, 0, callID))
	return err
}

// poll retries f until it returns nil or ctx ends (a busy machine may take long).
func poll(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
