package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/seal"
	"github.com/toolbus/toolbus/planner"
)

// signedStack is a stack whose planner, injector and executor each publish on a bus of
// their own with their own signing key (role.planner, role.injector, team.alpha owning
// the demo and diag tools), a client bus signing as client.tester (bound to identity
// tester), and the keyring of those keys and beta's (team.beta, owning no tool of the
// run) published to the core's bucket, as toolbus admin publish-keys does.
type signedStack struct {
	*stack
	client *events.Bus
	keys   map[string]seal.KeyFile
	ring   seal.Keyring
}

func newSignedStack(t *testing.T, model planner.Model) *signedStack {
	t.Helper()
	s := &signedStack{stack: newStack(t, model), keys: map[string]seal.KeyFile{}}
	from := time.Now().Add(-time.Minute)
	for _, signer := range []string{"role.planner", "role.injector", "team.alpha", "team.beta", "client.tester"} {
		kf := must(seal.NewKeyFile(signer))
		s.keys[signer] = kf
		k := seal.Key{KeyID: kf.KeyID, Signer: signer, Public: kf.Public(), Created: from}
		switch signer {
		case "team.alpha":
			k.Tools = map[string][]seal.Span{}
			for _, tool := range s.reg.Names() {
				k.Tools[tool] = []seal.Span{{From: from}}
			}
		case "team.beta":
			k.Tools = map[string][]seal.Span{"other_tool": {{From: from}}}
		case "client.tester":
			k.Identities = map[string][]seal.Span{"tester": {{From: from}}}
		}
		s.ring.Keys = append(s.ring.Keys, k)
	}
	s.buses = map[string]*events.Bus{}
	for role, signer := range map[string]string{"planner": "role.planner", "injector": "role.injector", "executor": "team.alpha", "client": "client.tester"} {
		b := must(events.Open(s.ctx, s.srv.Conn, events.Config{}))
		b.SetSigner(seal.SignerOf(s.keys[signer]))
		s.buses[role] = b
	}
	s.client = s.buses["client"]
	if _, err := seal.PublishKeyring(s.ctx, s.bus.JetStream(), s.ring); err != nil {
		t.Fatal(err)
	}
	// The core's checkpoints, signed with the planner's key at every run's end.
	s.start("checkpoint", (&checkpoint.Service{Bus: s.buses["planner"], Interval: time.Minute, Log: s.log}).Run)
	return s
}

// collect reads a run's bundle once a signed checkpoint covers every event of it.
func (s *signedStack) collect(run string) trail.Bundle {
	s.t.Helper()
	var b trail.Bundle
	eventstest.Eventually(s.t, time.Minute, func() error {
		var err error
		if b, err = trail.Collect(s.ctx, s.bus, run); err != nil {
			return err
		}
		if b.Checkpoint == nil || len(b.Checkpoint.Leaves) != len(b.Events) {
			return fmt.Errorf("run %s: no checkpoint covers its %d events yet", run, len(b.Events))
		}
		return nil
	})
	return b
}

// run starts a run as the client and waits for its end.
func (s *signedStack) run(run string) {
	s.t.Helper()
	err := s.client.StartRun(s.ctx, events.Source("client", "tester"), toolbus.RunStarted{
		RunID: run, Model: "test", Principal: toolbus.Principal{ID: "tester"},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "add twice"}},
	})
	if err != nil {
		s.t.Fatal(err)
	}
	if ended := s.waitEnd(run); ended.Status != toolbus.RunCompleted {
		s.t.Fatalf("run %s ended %s (%s)", run, ended.Status, ended.Reason)
	}
}

// twoCalls is a model that calls the calculator twice in one step, then answers.
func twoCalls() *planner.Script {
	return &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "calculator", `{"expression":"1+1"}`), call("b", "calculator", `{"expression":"2+2"}`)),
		planner.Answer("2 and 4"),
	}}
}

// index is the position of the first event of type typ (and call, when given) in b.
func index(t *testing.T, b trail.Bundle, typ, callID string) int {
	t.Helper()
	for i, r := range b.Events {
		if r.Header["ce-type"][0] == typ && (callID == "" || slices.Contains(r.Header["ce-callid"], callID)) {
			return i
		}
	}
	t.Fatalf("no %s %s in the trail", typ, callID)
	return -1
}

// mustFail verifies b and wants a Failure of check at the event at index at (-1: any).
func mustFail(t *testing.T, what string, b trail.Bundle, check string, at int) {
	t.Helper()
	_, err := trail.Verify(b)
	var f *trail.Failure
	if !errors.As(err, &f) {
		t.Fatalf("%s: verified (%v), want a failure", what, err)
	}
	if f.Check != check || at >= 0 && f.Index != at {
		t.Fatalf("%s: %v; want the %s check failing at event %d", what, f, check, at+1)
	}
	t.Logf("%s: %v", what, f)
}

func clone(b trail.Bundle) trail.Bundle {
	b.Events = slices.Clone(b.Events)
	return b
}

// TestAuditTrailVerifies: a run whose planner, injector, executor and client each sign
// with their own key verifies, on the live bus and from its exported bundle with no bus
// (every event signed by a signer allowed to publish it, the two parallel calls'
// results chained through their tool.requested, each tool.requested through the step's
// model.requested). Each tampering of the bundle an administrator could make to the
// stream fails naming the event: altered data, a removed event, two swapped events;
// and on the live bus, as the administrator (who may write the stream), an inserted
// well-formed result unsigned, and one signed with team beta's key for a tool alpha
// owns. CONTROL: the untouched run verifies.
func TestAuditTrailVerifies(t *testing.T) {
	t.Parallel()
	s := newSignedStack(t, twoCalls())
	s.startAll()
	s.run("signed-1")
	b := s.collect("signed-1")
	res, err := trail.Verify(b)
	if err != nil {
		t.Fatalf("untouched run: %v", err)
	}
	if want := []string{"client.tester", "role.injector", "role.planner", "team.alpha"}; !slices.Equal(res.Signers, want) {
		t.Fatalf("signers %v, want %v", res.Signers, want)
	}
	file := filepath.Join(t.TempDir(), "signed-1.json")
	if err := b.WriteFile(file); err != nil {
		t.Fatal(err)
	}
	off := must(trail.ReadFile(file))
	if _, err := trail.Verify(off); err != nil {
		t.Fatalf("exported bundle, offline: %v", err)
	}

	altered := clone(off)
	i := index(t, altered, events.TypeToolFinished, "b")
	var data map[string]any
	if err := json.Unmarshal(altered.Events[i].Data, &data); err != nil {
		t.Fatal(err)
	}
	data["content"] = "5"
	altered.Events[i].Data = must(json.Marshal(data))
	mustFail(t, "altered result", altered, "signature", i)

	removed := clone(off)
	j := index(t, removed, events.TypeModelRequested, "")
	removed.Events = slices.Delete(removed.Events, j, j+1)
	mustFail(t, "removed model.requested", removed, "chain", j)

	removedResult := clone(off)
	k := index(t, removedResult, events.TypeToolFinished, "a")
	removedResult.Events = slices.Delete(removedResult.Events, k, k+1)
	if _, err := trail.Verify(removedResult); err == nil {
		t.Fatal("a removed result verified")
	} else {
		t.Logf("removed result: %v", err)
	}

	// Call a's request removed, so that its result would pass as foreign: the step's
	// model.responded still lists the call (its result's chain fails); with that removed
	// too, the step's other call still counts it (complete).
	noReq := clone(off)
	q := index(t, noReq, events.TypeToolRequested, "a")
	noReq.Events = slices.Delete(noReq.Events, q, q+1)
	mustFail(t, "removed tool.requested", noReq, "chain", -1)
	m := index(t, noReq, events.TypeModelResponded, "")
	noReq.Events = slices.Delete(noReq.Events, m, m+1)
	if _, err := trail.Verify(noReq); err == nil {
		t.Error("HOLE: call a's request and the step's model.responded removed: the trail verifies")
	} else {
		t.Logf("removed tool.requested and model.responded: %v", err)
	}

	swapped := clone(off)
	r := index(t, swapped, events.TypeModelResponded, "")
	swapped.Events[j], swapped.Events[r] = swapped.Events[r], swapped.Events[j]
	mustFail(t, "swapped model.requested and model.responded", swapped, "chain", j)

	// Inserted on the live bus by the administrator: a result for call a (an event that
	// counts), unsigned; then one signed with beta's key. (One for a call never requested
	// counts for no reader: reported foreign, as a tenant's stray write is.)
	forged := toolbus.ToolFinished{RunID: "signed-1", Step: 0, CallIndex: 0, CallCount: 2,
		ToolResult: toolbus.ToolResult{CallID: "a", Tool: "calculator", Status: toolbus.StatusSucceeded, Content: "42", Attempt: 7}}
	if _, err := s.bus.PublishEvent(s.ctx, events.ToolFinishedEvent("/toolbus/executor/forged", forged)); err != nil {
		t.Fatal(err)
	}
	live, err := trail.Collect(s.ctx, s.bus, "signed-1")
	if err != nil {
		t.Fatal(err)
	}
	mustFail(t, "inserted unsigned result", live, "signature", len(off.Events))

	beta := must(events.Open(s.ctx, s.srv.Conn, events.Config{}))
	beta.SetSigner(seal.SignerOf(s.keys["team.beta"]))
	forged.Attempt = 8
	ctx := seal.WithParentDigest(s.ctx, seal.Digest(off.Events[index(t, off, events.TypeToolRequested, "a")].Header, off.Events[index(t, off, events.TypeToolRequested, "a")].Data))
	if _, err := beta.PublishEvent(ctx, events.ToolFinishedEvent("/toolbus/executor/beta", forged)); err != nil {
		t.Fatal(err)
	}
	live = must(trail.Collect(s.ctx, s.bus, "signed-1"))
	live.Events = slices.Delete(live.Events, len(off.Events), len(off.Events)+1) // the unsigned one, seen above
	mustFail(t, "result signed with another team's key", live, "signer", len(off.Events))
}

// TestAuditTrailKeyLifecycle: after alpha's key is rotated (retired, a new key issued)
// the run it signed before still verifies; a result its old key signs after the
// rotation fails the key check, as does one a revoked key signs after its revocation.
// A run none of whose events is signed (a deployment before signing) verifies as
// unsigned (ErrUnsignedRun), never as valid. CONTROL: the same run verifies before.
func TestAuditTrailKeyLifecycle(t *testing.T) {
	t.Parallel()
	s := newSignedStack(t, twoCalls())
	s.startAll()
	s.run("rotate-1")
	if _, err := trail.Verify(s.collect("rotate-1")); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	// Rotation: alpha's key retired now, a new one issued.
	now := time.Now()
	for i, k := range s.ring.Keys {
		if k.Signer == "team.alpha" {
			s.ring.Keys[i].Retired = now
		}
	}
	if _, err := seal.PublishKeyring(s.ctx, s.bus.JetStream(), s.ring); err != nil {
		t.Fatal(err)
	}
	b := must(trail.Collect(s.ctx, s.bus, "rotate-1"))
	if _, err := trail.Verify(b); err != nil {
		t.Fatalf("after the rotation, the run signed before: %v", err)
	}
	// The old key signs a result after its retirement.
	i := index(t, b, events.TypeToolRequested, "a")
	late := toolbus.ToolFinished{RunID: "rotate-1", Step: 0, CallIndex: 0, CallCount: 2,
		ToolResult: toolbus.ToolResult{CallID: "a", Tool: "calculator", Status: toolbus.StatusSucceeded, Content: "3", Attempt: 9}}
	e := events.ToolFinishedEvent("/toolbus/executor/old", late)
	e.Meta.ID += "/late"
	ctx := seal.WithParentDigest(s.ctx, seal.Digest(b.Events[i].Header, b.Events[i].Data))
	if _, err := s.busOf("executor").PublishEvent(ctx, e); err != nil {
		t.Fatal(err)
	}
	after := must(trail.Collect(s.ctx, s.bus, "rotate-1"))
	mustFail(t, "signed by the retired key after the rotation", after, "key", len(b.Events))

	// Revocation of beta's key: a result it signs after it is refused for the key, before
	// the signer check.
	for i, k := range s.ring.Keys {
		if k.Signer == "team.beta" {
			s.ring.Keys[i].Revoked = now
			s.ring.Keys[i].Tools["calculator"] = []seal.Span{{From: now.Add(-time.Hour)}}
		}
	}
	if _, err := seal.PublishKeyring(s.ctx, s.bus.JetStream(), s.ring); err != nil {
		t.Fatal(err)
	}
	beta := must(events.Open(s.ctx, s.srv.Conn, events.Config{}))
	beta.SetSigner(seal.SignerOf(s.keys["team.beta"]))
	e.Meta.ID += "/beta"
	if _, err := beta.PublishEvent(ctx, e); err != nil {
		t.Fatal(err)
	}
	after = must(trail.Collect(s.ctx, s.bus, "rotate-1"))
	after.Events = slices.Delete(after.Events, len(b.Events), len(b.Events)+1)
	mustFail(t, "signed by a revoked key", after, "key", len(b.Events))

	// A run of processes that sign nothing.
	for _, role := range []string{"planner", "injector", "executor"} {
		s.busOf(role).SetSigner(nil)
	}
	s.client.SetSigner(nil)
	s.run("unsigned-1")
	_, err := trail.Verify(must(trail.Collect(s.ctx, s.bus, "unsigned-1")))
	if !errors.Is(err, trail.ErrUnsignedRun) {
		t.Fatalf("unsigned run: %v, want ErrUnsignedRun", err)
	}
	t.Log(err)
}
