package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
)

// The end of a run that this store started is one compare-and-set on the revision it
// wrote, no read; when another writer came in between, that compare-and-set fails and
// the write reads and decides again, so nothing another writer stored is overwritten.
func TestRunStateWritesAfterOwnWrite(t *testing.T) {
	ended := func(run string, status toolbus.RunStatus) toolbus.RunEnded {
		return toolbus.RunEnded{RunID: run, Status: status, Code: "c", Reason: "r", StepsUsed: 3}
	}
	cases := []struct {
		name string
		// between is what another store writes between the create and the end (nil: nothing).
		between func(t *testing.T, other *store.Store, run string)
		// reads is the number of run state reads the end costs.
		reads   int
		wantErr error
		want    toolbus.RunStatus
		wantStp int
	}{
		{name: "alone", reads: 0, want: toolbus.RunCompleted, wantStp: 2},
		{name: "another writer moved the run on", between: func(t *testing.T, other *store.Store, run string) {
			if err := other.SetRunState(eventstest.Context(t, time.Minute), run, toolbus.RunWaitingForApproval, 1, "approval", "waits"); err != nil {
				t.Fatal(err)
			}
		}, reads: 1, want: toolbus.RunCompleted, wantStp: 2},
		{name: "another writer ended the run", between: func(t *testing.T, other *store.Store, run string) {
			if _, err := other.RecordEnd(eventstest.Context(t, time.Minute), 1, ended(run, toolbus.RunCancelled)); err != nil {
				t.Fatal(err)
			}
		}, reads: 1, wantErr: events.ErrRunEnded, want: toolbus.RunCancelled, wantStp: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := eventstest.Context(t, time.Minute)
			srv := eventstest.RunJetStream(t)
			bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{})
			if err != nil {
				t.Fatal(err)
			}
			nc2, _ := srv.Connect(t)
			other, _, err := provision.Setup(ctx, nc2, events.Config{})
			if err != nil {
				t.Fatal(err)
			}
			spy, _ := srv.Connect(t)
			reads := eventstest.Counter(t, spy, "$JS.API.DIRECT.GET.KV_"+store.BucketRuns+".>")
			const run = "r-written"
			started := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
			if created, err := bus.Store().CreateRunState(ctx, run, started); err != nil || !created {
				t.Fatalf("create: %v %v", created, err)
			}
			if tc.between != nil {
				tc.between(t, other.Store(), run)
			}
			before := reads()
			_, err = bus.Store().RecordEnd(ctx, 2, ended(run, toolbus.RunCompleted))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("end: %v, want %v", err, tc.wantErr)
			}
			if got := reads() - before; got != tc.reads {
				t.Errorf("the end read the run state %d times, want %d", got, tc.reads)
			}
			st, _, err := other.Store().RunState(ctx, run)
			if err != nil {
				t.Fatal(err)
			}
			if st.Status != tc.want || st.Step != tc.wantStp || !st.StartedAt.Equal(started) {
				t.Fatalf("stored %s at step %d started %s, want %s at step %d started %s",
					st.Status, st.Step, st.StartedAt, tc.want, tc.wantStp, started)
			}
		})
	}
}
