package fair_test

import (
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/fair"
)

// TestMinimumKeepsItsSlotFree: an executor of two slots; bob, guaranteed one call in
// flight, made a call lately; alice floods. The credit window (the default) releases
// alice's calls into the free slots but bob's, and bob's next call starts while alice's
// first still runs, none of hers finished. The control, the pace window, releases alice
// calls into both slots and more ahead, and bob's call waits behind them: the next call
// to start once one of alice's finishes is hers.
func TestMinimumKeepsItsSlotFree(t *testing.T) {
	for _, window := range []string{"credit", "pace"} {
		t.Run(window, func(t *testing.T) {
			r := newRig(t, true, 2, fair.Shares{Window: window, Minimum: "bob=1"})
			// The credit window serves a tool whose calls run 50 ms or more: bob's first
			// call runs longer, which the window learns.
			r.flood(t, "bob-0", "bob", 1)
			r.g.next(t)
			<-time.After(80 * time.Millisecond)
			r.g.release <- struct{}{}
			r.p.WaitStatus("bob-0", toolbus.RunCompleted)
			r.flood(t, "alice-1", "alice", 6)
			if who := r.g.next(t); who != "alice" {
				t.Fatalf("first call started: %s, want alice's", who)
			}
			if window == "pace" {
				if who := r.g.next(t); who != "alice" {
					t.Fatalf("second call started: %s, want alice's (the pace window fills both slots)", who)
				}
			}
			r.flood(t, "bob-1", "bob", 1)
			r.waitHeld(t, "bob", 1)
			if window == "pace" {
				r.g.release <- struct{}{}
			}
			who := r.g.next(t)
			t.Logf("%s window: the call started after alice's first: %s's", window, who)
			if window == "credit" && who != "bob" {
				t.Fatalf("credit window: %s's call started, want bob's in the slot his minimum kept free", who)
			}
			if window == "pace" && who != "alice" {
				t.Fatalf("pace window (control): %s's call started, want alice's, released ahead of bob's", who)
			}
			for range 8 {
				r.g.release <- struct{}{}
			}
			r.p.WaitStatus("bob-1", toolbus.RunCompleted)
		})
	}
}
