package e2e_test

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// TestOutsiderAuditTrailForgeries: a team with its own signing key (team.beta, owning
// other_tool, none of the run's tools) or a team whose key was rotated (team.alpha's
// retired key) tries to get an event into a run's trail that `toolbus replay --verify`
// and `toolbus audit verify` accept although the team had no right to it, by writing it
// on a subject it may publish (its own tool's) with attributes it chooses:
//   - beta's result, on its own tool's subject, naming alpha's call a, chained to a's
//     tool.requested: the trail would count a as answered by another tool;
//   - the same with alpha's real result removed (the administrator's edit the trail
//     exists to show): "no call lacks its result" would still hold;
//   - beta's result for a call that was never requested, chained to a model.requested;
//   - alpha's retired key signing a result after the rotation, its ce-time set back
//     before the rotation (the time a key's validity is judged at).
//
// Beta's results count for no reader (no call of its tool was requested): the run
// verifies and reports each foreign, and with alpha's result removed it fails; the
// retired key's result fails, naming the event. CONTROL: the untouched run verifies, and
// the same retired-key result with its true time fails the key check (as before).
func TestOutsiderAuditTrailForgeries(t *testing.T) {
	s := newSignedStack(t, twoCalls())
	s.startAll()
	s.run("probe-1")
	base := must(trail.Collect(s.ctx, s.bus, "probe-1"))
	if _, err := trail.Verify(base); err != nil {
		t.Fatalf("control: the untouched run: %v", err)
	}
	reqA := index(t, base, events.TypeToolRequested, "a")
	parentA := seal.WithParentDigest(s.ctx, seal.Digest(base.Events[reqA].Header, base.Events[reqA].Data))
	beta := must(events.Open(s.ctx, s.srv.Conn, events.Config{}))
	beta.SetSigner(seal.SignerOf(s.keys["team.beta"]))
	forgedFor := func(call string, step int) events.Envelope {
		tf := toolbus.ToolFinished{RunID: "probe-1", Step: step, CallIndex: 0, CallCount: 2,
			ToolResult: toolbus.ToolResult{CallID: call, Tool: "other_tool", Status: toolbus.StatusSucceeded, Content: "forged by beta"}}
		e := events.ToolFinishedEvent("/toolbus/executor/beta", tf)
		e.Meta.ID += "/beta"
		return e
	}

	// with is the trail of the run's own events and the forged event of id alone (each
	// forgery stays in the stream: the later trails leave the earlier ones out).
	lastSeq := base.Events[len(base.Events)-1].Seq
	with := func(id string) trail.Bundle {
		t.Helper()
		b := must(trail.Collect(s.ctx, s.bus, "probe-1"))
		b.Events = slices.DeleteFunc(b.Events, func(r trail.Record) bool { return r.Seq > lastSeq && r.Header["ce-id"][0] != id })
		if len(b.Events) != len(base.Events)+1 {
			t.Fatalf("want the run's %d events and %s, got %d", len(base.Events), id, len(b.Events))
		}
		return b
	}

	// 1. Beta answers each of alpha's calls on its own tool's subject, chained to the
	// call's request; 2. the same with alpha's real result of the call removed.
	for _, call := range []string{"a", "b"} {
		req := index(t, base, events.TypeToolRequested, call)
		parent := seal.WithParentDigest(s.ctx, seal.Digest(base.Events[req].Header, base.Events[req].Data))
		e := forgedFor(call, 0)
		if _, err := beta.PublishEvent(parent, e); err != nil {
			t.Fatal(err)
		}
		b := with(e.Meta.ID)
		ignored(t, "beta's result for alpha's call "+call, b, len(base.Events))
		real := slices.IndexFunc(b.Events, func(r trail.Record) bool {
			return r.Header["ce-type"][0] == events.TypeToolFinished && slices.Contains(r.Header["ce-callid"], call) &&
				r.Subject == events.SubjectToolFinished("probe-1", "calculator")
		})
		if real < 0 {
			t.Fatalf("control: no result of call %s in the trail", call)
		}
		b.Events = slices.Delete(b.Events, real, real+1)
		if _, err := trail.Verify(b); err == nil {
			t.Errorf("HOLE: alpha's result of %s removed and beta's for it inserted: the trail verifies", call)
		} else {
			t.Logf("alpha's result of %s replaced by beta's: %v", call, err)
		}
	}

	// 3. Beta answers a call never requested, chained to the step's model.requested.
	mr := index(t, base, events.TypeModelRequested, "")
	parentMR := seal.WithParentDigest(s.ctx, seal.Digest(base.Events[mr].Header, base.Events[mr].Data))
	if _, err := beta.PublishEvent(parentMR, forgedFor("ghost", 0)); err != nil {
		t.Fatal(err)
	}
	ghost := with(forgedFor("ghost", 0).Meta.ID)
	ignored(t, "beta's result for a call never requested", ghost, len(base.Events))

	// 4. Alpha's key rotated; its retired key signs a result afterwards, claiming a time
	// before the rotation. The run's own events were stored before the rotation.
	retired := time.Now()
	for i, k := range s.ring.Keys {
		if k.Signer == "team.alpha" {
			s.ring.Keys[i].Retired = retired
		}
	}
	late := toolbus.ToolFinished{RunID: "probe-1", Step: 0, CallIndex: 0, CallCount: 2,
		ToolResult: toolbus.ToolResult{CallID: "a", Tool: "calculator", Status: toolbus.StatusSucceeded, Content: "3", Attempt: 9}}
	for _, c := range []struct {
		what string
		at   time.Time
	}{{"control: true time", time.Time{}}, {"backdated a minute", retired.Add(-time.Minute)}} {
		e := events.ToolFinishedEvent("/toolbus/executor/old", late)
		e.Meta.ID += "/late/" + c.what
		e.Meta.Time = c.at
		if _, err := s.busOf("executor").PublishEvent(parentA, e); err != nil {
			t.Fatal(err)
		}
		after := with(e.Meta.ID)
		after.Keys = s.ring
		refused(t, "retired key, "+c.what, after, "key", -1)
	}

	// 5. Beta writes on its own tool's subject with headers of its choosing: none at all,
	// a CloudEvents type of the core's (the run's outcome), or the core's signed call
	// copied whole. The verifier judges an event by its subject (beta's tool, never
	// requested): each is foreign.
	for what, m := range map[string]*nats.Msg{"no CloudEvents headers": {Header: nats.Header{}, Data: []byte("junk")},
		"typed as the run's outcome":    {Header: nats.Header{"ce-specversion": {"1.0"}, "ce-type": {events.TypeRunEnded(toolbus.RunCompleted)}, "ce-runid": {"probe-1"}}, Data: []byte("junk")},
		"the core's signed call copied": {Header: maps.Clone(nats.Header(base.Events[reqA].Header)), Data: base.Events[reqA].Data}} {
		m.Subject = events.SubjectToolLog("probe-1", "other_tool")
		m.Header.Del(events.HeaderMsgID) // else a duplicate, not stored
		ack, err := beta.JetStream().PublishMsg(s.ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		b := must(trail.Collect(s.ctx, s.bus, "probe-1"))
		b.Events = slices.DeleteFunc(b.Events, func(r trail.Record) bool { return r.Seq > lastSeq && r.Seq != ack.Sequence })
		ignored(t, "beta's write with "+what, b, len(base.Events))
	}
}

// ignored verifies b and wants it to verify, the event at index at reported foreign.
func ignored(t *testing.T, what string, b trail.Bundle, at int) {
	t.Helper()
	res, err := trail.Verify(b)
	if err != nil || len(res.Foreign) != 1 || res.Foreign[0].Index != at {
		t.Errorf("%s: %v, foreign %+v; want it verified, event %d foreign", what, err, res.Foreign, at+1)
	}
}

// refused verifies b and wants a Failure of check at the event at index at (-1: any);
// unlike mustFail it goes on, so that every forgery is reported.
func refused(t *testing.T, what string, b trail.Bundle, check string, at int) {
	t.Helper()
	_, err := trail.Verify(b)
	var f *trail.Failure
	switch {
	case !errors.As(err, &f):
		t.Errorf("HOLE %s: verified (%v)", what, err)
	case f.Check != check || at >= 0 && f.Index != at:
		t.Errorf("%s: %v; want the %s check failing at event %d", what, f, check, at+1)
	default:
		t.Logf("%s: %v", what, f)
	}
}
