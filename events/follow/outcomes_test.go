package follow_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/follow"
)

// The outcome subscriptions answer for runs started after they listened, and only for
// those: an outcome published later is seen, a run started before is left to the run
// state, and so is every run once a message may have been lost.
func TestEndedRunsFromOutcomeEvents(t *testing.T) {
	ctx := eventstest.Context(t, time.Minute)
	bus := eventstest.Setup(t, events.Config{Memory: true})
	start := func(run string) uint64 {
		t.Helper()
		if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: run}); err != nil {
			t.Fatal(err)
		}
		seq, err := bus.RunStartedSeq(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	before := start("before")
	ends := follow.Outcomes(bus)
	if err := ends.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	defer ends.Close()
	after, other := start("after"), start("other")

	if _, ok := ends.Lookup("before", before); ok {
		t.Error("a run started before the subscriptions is answered by them")
	}
	if st, ok := ends.Lookup("after", after); !ok || st != "" {
		t.Errorf("a run started after the subscriptions, not ended: got %q, %v; want \"\", true", st, ok)
	}
	if _, err := bus.Publish(ctx, events.SubjectRunEnded("after", toolbus.RunCancelled), events.Meta{
		ID: "after/0/run.cancelled", Type: events.TypeRunEnded(toolbus.RunCancelled), Source: "/test", RunID: "after",
	}, toolbus.RunEnded{RunID: "after", Status: toolbus.RunCancelled}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		if st, ok := ends.Lookup("after", after); !ok || st != toolbus.RunCancelled {
			return fmt.Errorf("got %q, %v; want cancelled, true", st, ok)
		}
		return nil
	})
	if st, ok := ends.Lookup("other", other); !ok || st != "" {
		t.Errorf("another run: got %q, %v; want \"\", true", st, ok)
	}

	// A lost message (here: the map emptied to bound it) makes every run not known to
	// have ended go to the run state until the subscriptions are trusted again.
	ends.ForgetTrust()
	if _, ok := ends.Lookup("other", other); ok {
		t.Error("untrusted subscriptions answered")
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		if from := ends.TrustedFrom(); from < other {
			return fmt.Errorf("trusted from sequence %d, want at least %d", from, other)
		}
		return nil
	})
	if _, ok := ends.Lookup("other", other); ok {
		t.Error("a run started before the new trusted sequence is answered by the subscriptions")
	}
}

// Followed run-state writes tell an end before its outcome event, and when a crash lost
// the event: the outcome events alone do not. Only a terminal write whose body names the
// run of its key counts, and a write received but not yet handled keeps the follower
// from answering (the caller reads) without making it distrust its subscriptions.
func TestEndedRunsFromRunStateWrites(t *testing.T) {
	ctx := eventstest.Context(t, time.Minute)
	bus := eventstest.Setup(t, events.Config{Memory: true})
	// The followers trust themselves from the stream's last sequence: not 0.
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "first"}); err != nil {
		t.Fatal(err)
	}
	plain := follow.Outcomes(bus)
	if err := plain.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ends := follow.Outcomes(bus)
	ends.FollowRunStates()
	entered, release := holdStateWrite(ends, "held")
	if err := ends.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	defer ends.Close()
	seqs := map[string]uint64{}
	for _, run := range []string{"crashed", "waiting", "forged", "named", "deleted", "sync", "held"} {
		if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: run}); err != nil {
			t.Fatal(err)
		}
		seq, err := bus.RunStartedSeq(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		seqs[run] = seq
	}
	lookup := func(f *follow.RunOutcomes, run string) (toolbus.RunStatus, bool) {
		return f.Lookup(run, seqs[run])
	}

	// The end is recorded, and its writer crashed before publishing the outcome event.
	if _, err := bus.Store().RecordEnd(ctx, 0, toolbus.RunEnded{RunID: "crashed", Status: toolbus.RunFailed}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		if st, ok := lookup(ends, "crashed"); !ok || st != toolbus.RunFailed {
			return fmt.Errorf("got %q, %v; want failed, true", st, ok)
		}
		return nil
	})
	if st, ok := lookup(plain, "crashed"); !ok || st != "" {
		t.Fatalf("the outcome events alone: got %q, %v; want them blind to it (\"\", true) from=%d seq=%d", st, ok, plain.TrustedFrom(), seqs["crashed"])
	}

	// A run that waits is not ended; a write whose body names another run than its key,
	// and a delete marker with a terminal body, end nothing.
	if err := bus.Store().SetRunState(ctx, "waiting", toolbus.RunWaitingForApproval, 0, "", ""); err != nil {
		t.Fatal(err)
	}
	nc := bus.Conn()
	if err := nc.Publish("$KV.toolbus_runs.forged", []byte(`{"run_id":"named","status":"failed"}`)); err != nil {
		t.Fatal(err)
	}
	del := nats.NewMsg("$KV.toolbus_runs.deleted")
	del.Header.Set("KV-Operation", "DEL")
	del.Data = []byte(`{"run_id":"deleted","status":"failed"}`)
	if err := nc.PublishMsg(del); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Store().RecordEnd(ctx, 0, toolbus.RunEnded{RunID: "sync", Status: toolbus.RunCompleted}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error { // handled in order: the writes above are too
		if st, _ := lookup(ends, "sync"); st != toolbus.RunCompleted {
			return fmt.Errorf("sync: %q", st)
		}
		return nil
	})
	for _, run := range []string{"waiting", "forged", "named", "deleted"} {
		if st, ok := lookup(ends, run); !ok || st != "" {
			t.Errorf("%s: got %q, %v; want \"\", true", run, st, ok)
		}
	}

	// A write in the handler, not yet recorded: no answer, and no loss of trust.
	from := ends.TrustedFrom()
	if _, err := bus.Store().RecordEnd(ctx, 0, toolbus.RunEnded{RunID: "held", Status: toolbus.RunCancelled}); err != nil {
		t.Fatal(err)
	}
	<-entered
	if st, ok := lookup(ends, "held"); ok {
		t.Errorf("a write being handled: got %q, %v; want no answer", st, ok)
	}
	if st, ok := lookup(ends, "waiting"); ok {
		t.Errorf("another run while a write is being handled: got %q, %v; want no answer", st, ok)
	}
	if got := ends.TrustedFrom(); got != from {
		t.Errorf("trusted from %d, was %d: a write being handled is not a lost one", got, from)
	}
	close(release)
	eventstest.Eventually(t, 10*time.Second, func() error {
		if st, ok := lookup(ends, "held"); !ok || st != toolbus.RunCancelled {
			return fmt.Errorf("got %q, %v; want cancelled, true", st, ok)
		}
		return nil
	})
}

// Subscriptions in place on an empty stream answer for the first run started after
// them: every event of that run comes later (an empty stream used to leave them
// untrusted until something else was published and a lookup refreshed them).
func TestEndedRunsFromAnEmptyStream(t *testing.T) {
	ctx := eventstest.Context(t, time.Minute)
	bus := eventstest.Setup(t, events.Config{Memory: true})
	ends := follow.Outcomes(bus)
	if err := ends.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	defer ends.Close()
	if !ends.Trusted() || ends.TrustedFrom() != 0 {
		t.Fatalf("on an empty stream: trusted %v from %d, want true from 0", ends.Trusted(), ends.TrustedFrom())
	}
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "first"}); err != nil {
		t.Fatal(err)
	}
	seq, err := bus.RunStartedSeq(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := ends.Lookup("first", seq); !ok || st != "" {
		t.Errorf("the first run of the stream, not ended: got %q, %v; want \"\", true", st, ok)
	}
	// Trust lost: an empty-stream sequence recorded earlier is not kept.
	ends.ForgetTrust()
	if _, ok := ends.Lookup("first", seq); ok {
		t.Error("untrusted subscriptions answered")
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		if !ends.Trusted() || ends.TrustedFrom() < seq {
			return fmt.Errorf("trusted %v from %d, want from at least %d", ends.Trusted(), ends.TrustedFrom(), seq)
		}
		return nil
	})
	if _, ok := ends.Lookup("first", seq); ok {
		t.Error("a run started before the new trusted sequence is answered by the subscriptions")
	}
}

// A lookup that comes while run-state writes received before it are still being
// handled waits for them (statesCatchUp) and answers, instead of sending its caller to
// read the run state: the step of a run comes right behind its latest write.
func TestEndedRunsWaitForTheWritesBefore(t *testing.T) {
	ctx := eventstest.Context(t, time.Minute)
	bus := eventstest.Setup(t, events.Config{Memory: true})
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "first"}); err != nil {
		t.Fatal(err)
	}
	ends := follow.Outcomes(bus)
	ends.FollowRunStates()
	ends.SetCatchUp(time.Minute) // far beyond the release below
	entered, release := holdStateWrite(ends, "held")
	if err := ends.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	defer ends.Close()
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "held"}); err != nil {
		t.Fatal(err)
	}
	seq, err := bus.RunStartedSeq(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Store().RecordEnd(ctx, 0, toolbus.RunEnded{RunID: "held", Status: toolbus.RunCancelled}); err != nil {
		t.Fatal(err)
	}
	<-entered
	type answer struct {
		st toolbus.RunStatus
		ok bool
	}
	got := make(chan answer, 1)
	go func() {
		st, ok := ends.Lookup("held", seq)
		got <- answer{st, ok}
	}()
	select {
	case a := <-got:
		t.Fatalf("answered %q, %v while the write before it was being handled: want a wait", a.st, a.ok)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if a := <-got; !a.ok || a.st != toolbus.RunCancelled {
		t.Fatalf("got %q, %v; want cancelled, true once the write was handled", a.st, a.ok)
	}
}

// holdStateWrite makes ends' handler of run-state writes stop at the write of run:
// entered is closed when it gets there, and it goes on once release is closed.
func holdStateWrite(ends *follow.RunOutcomes, run string) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	ends.OnStateWrite(func(r string) {
		if r == run {
			close(entered)
			<-release
		}
	})
	return entered, release
}
