package events_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
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
	ends := bus.RunOutcomes()
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
