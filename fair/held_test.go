package fair_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/fair"
)

// TestHeldAnswersTheAskerOnly: the scheduler answers toolbus_fair.held.<tool>.<identity>
// with that identity's held calls and nothing of another tenant's, and
// toolbus_fair.held.<tool> (the core's) with every tenant's (the control).
func TestHeldAnswersTheAskerOnly(t *testing.T) {
	r := newRig(t, true, 1, fair.Shares{})
	r.flood(t, "alice-1", "alice", 6)
	r.flood(t, "bob-1", "bob", 6)
	r.waitHeld(t, "alice", 1)
	r.waitHeld(t, "bob", 1)
	ask := func(subject string) []fair.Held {
		msg, err := r.p.Bus.Conn().Request(subject, nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var hs []fair.Held
		if err := json.Unmarshal(msg.Data, &hs); err != nil {
			t.Fatal(err)
		}
		return hs
	}
	if all := ask(events.FairHeldSubject("gate")); len(all) != 2 {
		t.Fatalf("the core's answer %+v, want alice's and bob's", all)
	}
	for _, who := range []string{"alice", "bob"} {
		hs := ask(events.FairHeldForSubject("gate", who))
		if len(hs) != 1 || hs[0].Tenant != who || hs[0].Queued == 0 {
			t.Fatalf("%s's answer %+v, want its own held calls only", who, hs)
		}
	}
	if hs := ask(events.FairHeldForSubject("gate", "carol")); len(hs) != 0 {
		t.Fatalf("carol's answer %+v, want nothing (she holds no call)", hs)
	}
	for range 12 {
		r.g.release <- struct{}{}
	}
}
