package fair_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/fair"
	"github.com/toolbus/toolbus/planner"
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

// TestHeldViewKeepsDottedToolsApart: calls of two tools whose names are no subject token
// ("a.b" and "c.d", as a model may name them) wait on the unknown tools' queue together,
// but each has a held view of its own (events.FairHeldToken): the view of "a.b" lists
// only a.b's calls. The control: the unknown tools' queue itself lists both. (The
// planner answers such calls at once; the scheduler, started after, holds them by the
// cap, since their results came before it listened.)
func TestHeldViewKeepsDottedToolsApart(t *testing.T) {
	r := newRigIdle(t, true, 1, fair.Shares{Caps: events.UnknownToolToken + "=1"})
	runs := map[string]string{"a.b": "ab-1", "c.d": "cd-1"}
	for tool, run := range runs {
		r.scripts[run] = &planner.Script{Steps: []func(planner.Request) planner.Response{planner.Calls(
			toolbus.ToolCall{CallID: "x", Tool: tool, Arguments: `{}`}, toolbus.ToolCall{CallID: "y", Tool: tool, Arguments: `{}`}),
			planner.Answer("done")}}
		r.p.SubmitAs(run, "alice", "go", toolbus.Limits{})
		r.waitRequested(t, run, 2)
	}
	r.startScheduler(t)
	count := func(tool string) (n int, keys []string) {
		msg, err := r.p.Bus.Conn().Request(events.FairHeldSubject(tool), nil, 10*time.Second)
		if err != nil {
			return -1, nil // not listening yet
		}
		var hs []fair.Held
		if err := json.Unmarshal(msg.Data, &hs); err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			n, keys = n+h.Queued+h.InFlight, append(keys, h.Calls...)
		}
		return n, keys
	}
	eventstest.Eventually(t, time.Minute, func() error {
		if n, _ := count(events.UnknownToolToken); n != 4 {
			return fmt.Errorf("the unknown tools' queue has %d calls, want 4 (a.b's and c.d's)", n)
		}
		for tool, run := range runs {
			n, keys := count(tool)
			if n != 2 {
				return fmt.Errorf("the held view of %s has %d calls (%v), want its own 2", tool, n, keys)
			}
			for _, k := range keys {
				if !strings.Contains(k, run) {
					return fmt.Errorf("the held view of %s lists %s, another tool's call", tool, k)
				}
			}
		}
		return nil
	})
}
