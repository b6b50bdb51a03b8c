package events_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/intake/intaketest"
)

// TestTeamTakeOverReadsTheMirror: with the read mirror `toolbus init` sets up, the event
// stream serves no direct gets; a team's take-over check of its tool's result in a run
// (Bus.Stored, in the accounts layout as the generator renders it) then reads the
// mirror, and finds the result the core stored, where it used to find nothing and go by
// the claim's done mark alone (a result stored by an executor that died before marking
// its claim done ran again). Another team finds nothing of it by the same route.
// CONTROL: the core finds the result with its own credentials, and the team's check of
// a result not stored answers not stored, without an error.
func TestTeamTakeOverReadsTheMirror(t *testing.T) {
	srv := intaketest.StartTeams(t, map[string][]string{"alpha": {"calc"}, "beta": {"other"}})
	ctx := eventstest.Context(t, time.Minute)
	core, _, err := provision.Setup(ctx, eventstest.Connect(t, srv, "core"), events.Config{}, provision.WithReadMirror())
	if err != nil {
		t.Fatal(err)
	}
	result := func(run string) events.Envelope {
		return events.ToolFinishedEventOn("/alpha/alpha-1", toolbus.ToolFinished{RunID: run, Step: 0, CallIndex: 0, CallCount: 1,
			ToolResult: toolbus.ToolResult{CallID: "c1", Tool: "calc", Content: `"42"`}}, "calc")
	}
	if _, err := core.PublishEvent(ctx, result("mirror-1")); err != nil {
		t.Fatal(err)
	}
	mirror, err := core.JetStream().Stream(ctx, events.ReadMirrorName(events.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		info, err := mirror.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs < 1 {
			return fmt.Errorf("%d messages", info.State.Msgs)
		}
		return nil
	})
	if _, found, err := core.Stored(ctx, result("mirror-1")); err != nil || !found {
		t.Fatalf("the control: the core's check of the result: found %v, %v", found, err)
	}
	team := func(user string) *events.Bus {
		b, err := events.Open(ctx, eventstest.Connect(t, srv, user), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	alpha := team("alpha")
	if _, found, err := alpha.Stored(ctx, result("mirror-1")); err != nil || !found {
		t.Errorf("alpha's take-over check of its tool's stored result: found %v, %v (want found)", found, err)
	}
	if _, found, err := alpha.Stored(ctx, result("mirror-absent")); err != nil || found {
		t.Errorf("alpha's check of a result not stored: found %v, %v (want not found, no error)", found, err)
	}
	if _, found, _ := team("beta").Stored(ctx, result("mirror-1")); found {
		t.Errorf("beta found alpha's result")
	}
	beta := eventstest.Connect(t, srv, "beta")
	subj := eventstest.TeamAPIPrefix + ".DIRECT.GET." + events.ReadMirrorName(events.DefaultStream) + "." + events.SubjectToolFinished("mirror-1", "calc")
	if m, err := beta.Request(subj, nil, time.Second); err == nil && m.Header.Get("Nats-Sequence") != "" {
		t.Errorf("beta read alpha's result on the mirror: %s", m.Data)
	} else if err != nil && err != nats.ErrNoResponders && err != nats.ErrTimeout {
		t.Logf("beta's direct get on the mirror: %v", err)
	}
}
