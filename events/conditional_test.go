package events_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
)

// The JetStream headers of a conditional publish (Nats-Expected-Last-Subject-Sequence
// over a subject of choice), as StartRun sends them.
const (
	hdrExpectedSeq  = "Nats-Expected-Last-Subject-Sequence"
	hdrExpectedSubj = "Nats-Expected-Last-Subject-Sequence-Subject"
)

// publishAs stores e on its subject with the Nats-Msg-Id msgID and the extra headers:
// what any publisher allowed on the subject can send. A msgID other than the event's
// keeps the duplicate window out of the way, as if the event's own id had left it.
func publishAs(t *testing.T, ctx context.Context, bus *events.Bus, e events.Envelope, msgID string, hdr map[string]string) (*jetstream.PubAck, error) {
	t.Helper()
	msg, err := events.Encode(e.Subject, e.Meta, e.Data)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		msg.Header.Set(k, v)
	}
	return bus.JetStream().PublishMsg(ctx, msg, jetstream.WithMsgID(msgID))
}

// runMessages counts the messages stored on the subjects of a run.
func runMessages(t *testing.T, ctx context.Context, bus *events.Bus, run string) int {
	t.Helper()
	n := 0
	for seq := uint64(1); ; n++ {
		raw, err := bus.EventStream().GetMsg(ctx, seq, jetstream.WithGetMsgSubject(events.SubjectRun(run)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		seq = raw.Sequence + 1
	}
}

// A run id that has a run.started is refused with ErrRunExists and nothing is stored,
// also when the duplicate window no longer knows the id (here: the first run.started
// was stored under another message id, as a resubmission after the window meets it):
// the conditional publish, not the window, refuses it.
func TestStartRunRefusesAnIDThatHasARunStarted(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	for _, principal := range []string{"", "alice", "bob"} {
		run := "taken-" + principal
		first := events.RunStartedEvent("/other", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: principal}})
		if _, err := publishAs(t, ctx, bus, first, "elsewhere/"+run, nil); err != nil {
			t.Fatal(err)
		}
		err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: "bob"}})
		if !errors.Is(err, events.ErrRunExists) {
			t.Fatalf("StartRun of %s, which has a run.started for %q: %v, want ErrRunExists", run, principal, err)
		}
		if n := runMessages(t, ctx, bus, run); n != 1 {
			t.Fatalf("%d messages of run %s, want the first run.started only", n, run)
		}
	}
}

// Messages of a run that are no run.started of it (forgeries consumers terminate) do not
// keep the run id from starting: StartRun reads the run's subjects, as before the
// conditional publish, and the run.started it stores is the run's first.
func TestStartRunAfterForgeriesOfTheRun(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	const run = "forged-before"
	otherRun := events.RunStartedEvent("/evil", toolbus.RunStarted{RunID: "elsewhere"})
	otherRun.Subject = events.SubjectRunStarted(run, "")
	result := events.ToolFinishedEvent("/evil", toolbus.ToolFinished{RunID: run, CallCount: 1,
		ToolResult: toolbus.ToolResult{CallID: "c", Tool: "noop", Status: toolbus.StatusSucceeded}})
	for i, e := range []events.Envelope{otherRun, result} {
		if _, err := publishAs(t, ctx, bus, e, fmt.Sprintf("forged-%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: "carol"}}); err != nil {
		t.Fatalf("StartRun after forgeries: %v", err)
	}
	rs, seq, err := bus.RunStartedAt(ctx, run)
	if err != nil || rs.Principal.ID != "carol" {
		t.Fatalf("RunStartedAt = %+v, %v", rs, err)
	}
	raw, err := bus.EventStream().GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if bus.FirstOfRun(raw.Header, run) {
		t.Fatal("a run.started stored after other messages of its run is attested as the run's first")
	}
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: run}); !errors.Is(err, events.ErrRunExists) {
		t.Fatalf("second StartRun: %v, want ErrRunExists", err)
	}
}

// Concurrent submissions of one run id for different principals (different subjects,
// one id): exactly one starts the run, and it is the run's first run.started.
func TestStartRunConcurrentSubmissions(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	for round := range 5 {
		run := fmt.Sprintf("race-%d", round)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				errs[i] = bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: fmt.Sprintf("p%d", i)}})
			})
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("%s: submissions %d and %d both started the run", run, winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, events.ErrRunExists):
				t.Fatalf("%s: submission %d: %v", run, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("%s: no submission started the run: %v", run, errs)
		}
		rs, err := bus.RunStarted(ctx, run)
		if err != nil || rs.Principal.ID != fmt.Sprintf("p%d", winner) {
			t.Fatalf("%s: first run.started %+v (%v), want submission %d's", run, rs, err, winner)
		}
	}
}

// A run.started that StartRun stores on a new run id carries the condition the stream
// checked (no message of the run before it), and FirstOfRun takes it as the run's first;
// no look-alike condition is taken so: one over a narrower subject, over another run,
// with another expected sequence, or with a header twice. The stream refuses the
// run-wide condition once the run has a message, whoever sends it.
func TestFirstOfRun(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "fresh", Principal: toolbus.Principal{ID: "alice"}}); err != nil {
		t.Fatal(err)
	}
	_, seq, err := bus.RunStartedAt(ctx, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := bus.EventStream().GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if !bus.FirstOfRun(raw.Header, "fresh") {
		t.Fatalf("the run.started of a new run is not attested as its first: %v", raw.Header)
	}
	if bus.FirstOfRun(raw.Header, "other") {
		t.Fatal("a run.started is attested as the first of another run")
	}

	// The run-wide condition on a run that has a message: refused, for any publisher.
	later := events.RunStartedEvent("/evil", toolbus.RunStarted{RunID: "fresh", Principal: toolbus.Principal{ID: "eve"}})
	_, err = publishAs(t, ctx, bus, later, "later", map[string]string{hdrExpectedSeq: "0", hdrExpectedSubj: events.SubjectRun("fresh")})
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("run-wide condition on a run with a message: %v, want wrong last sequence", err)
	}
	// A condition over eve's own (empty) subject holds, so it is stored, but it says
	// nothing of the run.
	ack, err := publishAs(t, ctx, bus, later, "later-narrow", map[string]string{hdrExpectedSeq: "0", hdrExpectedSubj: later.Subject})
	if err != nil {
		t.Fatal(err)
	}
	narrow, err := bus.EventStream().GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if bus.FirstOfRun(narrow.Header, "fresh") {
		t.Fatal("a condition over one subject of the run is taken for the run's first message")
	}
	for name, h := range map[string]nats.Header{
		"no subject":     {hdrExpectedSeq: {"0"}},
		"other sequence": {hdrExpectedSeq: {"1"}, hdrExpectedSubj: {events.SubjectRun("fresh")}},
		"all runs":       {hdrExpectedSeq: {"0"}, hdrExpectedSubj: {events.FilterAll}},
		"twice":          {hdrExpectedSeq: {"0"}, hdrExpectedSubj: {events.SubjectRun("other"), events.SubjectRun("fresh")}},
		"sequence twice": {hdrExpectedSeq: {"5", "0"}, hdrExpectedSubj: {events.SubjectRun("fresh")}},
	} {
		if bus.FirstOfRun(h, "fresh") {
			t.Errorf("%s: %v taken for the run's first message", name, h)
		}
	}
}

// A terminal outcome reaches the stream once: published again when the stream holds it
// under another message id (the duplicate window no longer knows it), it is not stored
// a second time; a forgery on its subject does not keep it out.
func TestPublishOutcomeOnce(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	ended := func(run string) store.RunState {
		return store.RunState{RunID: run, Status: toolbus.RunCompleted, Step: 2,
			Ended: &toolbus.RunEnded{RunID: run, Status: toolbus.RunCompleted, Answer: "done", StepsUsed: 3}}
	}
	st := ended("out-1")
	e := events.RunEndedEvent("/test", st.Step, *st.Ended)
	if _, err := publishAs(t, ctx, bus, e, "earlier/out-1", nil); err != nil {
		t.Fatal(err)
	}
	if err := bus.PublishOutcome(ctx, "/test", st); err != nil {
		t.Fatal(err)
	}
	if got := onSubject(t, ctx, bus, e); len(got) != 1 {
		t.Fatalf("outcome stored %d times, want once", len(got))
	}

	st = ended("out-2")
	e = events.RunEndedEvent("/test", st.Step, *st.Ended)
	forged := events.RunEndedEvent("/evil", st.Step, toolbus.RunEnded{RunID: "out-2", Status: toolbus.RunCompleted, Answer: "forged"})
	forged.Meta.ID = "forged/out-2"
	if _, err := publishAs(t, ctx, bus, forged, forged.Meta.ID, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 { // and a re-publish after a crash stores nothing more
		if err := bus.PublishOutcome(ctx, "/test", st); err != nil {
			t.Fatal(err)
		}
	}
	if got := onSubject(t, ctx, bus, e); len(got) != 1 {
		t.Fatalf("outcome after a forgery on its subject stored %d times, want once", len(got))
	}

	// A run waits for approval once per set of pending calls: each wait is stored.
	for pending := 1; pending <= 2; pending++ {
		calls := make([]toolbus.ToolCall, pending)
		for i := range calls {
			calls[i] = toolbus.ToolCall{CallID: fmt.Sprintf("c%d", i), Tool: "noop"}
		}
		w := &toolbus.RunEnded{RunID: "out-3", Status: toolbus.RunWaitingForApproval, Pending: calls, StepsUsed: 1}
		if err := bus.PublishOutcome(ctx, "/test", store.RunState{RunID: "out-3", Status: w.Status, Ended: w}); err != nil {
			t.Fatal(err)
		}
	}
	if n := runMessages(t, ctx, bus, "out-3"); n != 2 {
		t.Fatalf("%d waits stored, want 2", n)
	}
}
