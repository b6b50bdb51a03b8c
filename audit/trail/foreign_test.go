package trail_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// TestAuditTrailForeignWrites: another tenant's write in tester's run (the write service
// stores a client's answer, decision or cancel and a team's tool events on any run id)
// cannot flip the run's verdict: mallory's unsigned answer and team calc's correctly
// signed tool.log of a call the run never requested of calc are reported foreign and
// the run verifies, as does mallory's answer whose data does not decode. CONTROLS: the
// untouched run verifies with nothing foreign; tester's own unsigned answer (which
// counts) fails its signature, and one whose data does not decode fails decode; the administrator's altered
// model.responded fails its signature, and tester's signed answer rewritten as
// mallory's (to pass as foreign) fails the checkpoint, each naming the event.
func TestAuditTrailForeignWrites(t *testing.T) {
	const run = "bob-1"
	answer := func(who string) events.Envelope {
		return events.ToolAnswerEvent("/toolbus/client/"+who, toolbus.ToolAnswer{RunID: run, CallID: "x", Who: who, Seq: 1, Action: "accept"})
	}
	calcLog := events.ToolLogEvent("/toolbus/executor/calc", toolbus.ToolLog{RunID: run, CallID: "c9", Tool: "calc", Seq: 1})
	// on names e's subject identity who: its data no longer agrees with it (decode).
	on := func(e events.Envelope, who string) events.Envelope {
		e.Subject = events.SubjectToolAnswer(run, who)
		return e
	}

	if res, err := trail.Verify(runBundle(t, run)); err != nil || len(res.Foreign) != 0 {
		t.Fatalf("control: the untouched run: %v, foreign %v", err, res.Foreign)
	}
	for _, c := range []struct {
		what   string
		env    events.Envelope
		signer string
	}{{"mallory's unsigned answer", answer("mallory"), ""}, {"team calc's signed log of a call never requested", calcLog, "team.calc"},
		{"mallory's answer whose data names tester", on(answer("tester"), "mallory"), ""}} {
		b := runBundle(t, run, stray{c.env, c.signer})
		res, err := trail.Verify(b)
		if err != nil {
			t.Errorf("HOLE: %s fails tester's run: %v", c.what, err)
			continue
		}
		if len(res.Foreign) != 1 || res.Foreign[0].Index != 4 {
			t.Errorf("%s: want event 5 reported foreign, got %+v", c.what, res.Foreign)
		}
		var out bytes.Buffer
		if code := trail.Explain(&out, run, res, err); code != 0 || !strings.Contains(out.String(), "event 5 (stream seq 5") || !strings.Contains(out.String(), "foreign: ignored") {
			t.Errorf("%s: exit %d: %s", c.what, code, &out)
		}
	}

	mustFail(t, "tester's own unsigned answer", runBundle(t, run, stray{answer("tester"), ""}), "signature", 4)
	mustFail(t, "tester's own answer whose data names mallory", runBundle(t, run, stray{on(answer("mallory"), "tester"), "client.tester"}), "decode", 4)
	altered := runBundle(t, run)
	altered.Events[2].Data = bytes.Replace(altered.Events[2].Data, []byte(`"hi"`), []byte(`"ho"`), 1)
	mustFail(t, "an altered model.responded", altered, "signature", 2)
	disguised := runBundle(t, run, stray{answer("tester"), "client.tester"})
	if _, err := trail.Verify(disguised); err != nil {
		t.Fatalf("control: tester's signed answer: %v", err)
	}
	m := answer("mallory")
	msg, err := events.Encode(m.Subject, m.Meta, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	disguised.Events[4].Subject, disguised.Events[4].Header, disguised.Events[4].Data = msg.Subject, msg.Header, msg.Data
	mustFail(t, "tester's answer rewritten as mallory's", disguised, "checkpoint", 4)
}

func mustFail(t *testing.T, what string, b trail.Bundle, check string, at int) {
	t.Helper()
	_, err := trail.Verify(b)
	var f *trail.Failure
	if !errors.As(err, &f) || f.Check != check || f.Index != at {
		t.Errorf("%s: %v; want the %s check failing at event %d", what, err, check, at+1)
	}
}

// stray is an event written after the run, signed by signer ("": unsigned).
type stray struct {
	env    events.Envelope
	signer string
}

// runBundle is tester's run (run.started, model.requested, model.responded,
// run.completed), then the strays, signed, chained and checkpointed.
func runBundle(t *testing.T, run string, strays ...stray) trail.Bundle {
	return editedBundle(t, run, nil, strays...)
}

// editedBundle is runBundle with each stray's message rewritten by edit before it is
// signed (a tenant's headers are its own to choose).
func editedBundle(t *testing.T, run string, edit func(*nats.Msg), strays ...stray) trail.Bundle {
	from := time.Now().Add(-time.Hour).UTC()
	keys := map[string]seal.KeyFile{}
	b := trail.Bundle{Format: trail.BundleFormat, Run: run, Stream: events.DefaultStream, Exported: time.Now().UTC()}
	for _, s := range []string{"role.planner", "client.tester", "team.calc"} {
		kf, err := seal.NewKeyFile(s)
		if err != nil {
			t.Fatal(err)
		}
		keys[s] = kf
		k := seal.Key{KeyID: kf.KeyID, Signer: s, Public: kf.Public(), Created: from}
		switch s {
		case "client.tester":
			k.Identities = map[string][]seal.Span{"tester": {{From: from}}}
		case "team.calc":
			k.Tools = map[string][]seal.Span{"calc": {{From: from}}}
		}
		b.Keys.Keys = append(b.Keys.Keys, k)
	}
	user := toolbus.Message{Role: toolbus.RoleUser, Content: "hello"}
	type ev struct {
		env    events.Envelope
		signer string
		parent int // index of the event it follows, -1 none
	}
	evs := []ev{
		{events.RunStartedEvent("/toolbus/client/tester", toolbus.RunStarted{RunID: run, Model: "test", Principal: toolbus.Principal{ID: "tester"}, Messages: []toolbus.Message{user}}), "client.tester", -1},
		{events.ModelRequestedEvent("/toolbus/injector/i1", toolbus.ModelRequested{RunID: run}), "role.planner", 0},
		{events.ModelRespondedEvent("/toolbus/planner/p1", toolbus.ModelResponded{RunID: run, Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "hi"}}), "role.planner", 1},
		{events.RunEndedEvent("/toolbus/planner/p1", 0, toolbus.RunEnded{RunID: run, Status: toolbus.RunCompleted, Answer: "hi"}), "role.planner", 1},
	}
	for _, s := range strays {
		evs = append(evs, ev{s.env, s.signer, -1})
	}
	var tree checkpoint.Tree
	for i, e := range evs {
		msg, err := events.Encode(e.env.Subject, e.env.Meta, e.env.Data)
		if err != nil {
			t.Fatal(err)
		}
		if e.parent >= 0 {
			p := b.Events[e.parent]
			msg.Header[seal.HeaderPrevDigest] = []string{seal.Digest(p.Header, p.Data)}
		}
		if edit != nil && i >= 4 {
			edit(msg)
		}
		if e.signer != "" {
			if err := seal.SignerOf(keys[e.signer]).Sign(msg.Header, msg.Data); err != nil {
				t.Fatal(err)
			}
		}
		b.Events = append(b.Events, trail.Record{Seq: uint64(i + 1), Subject: msg.Subject, Header: msg.Header, Data: msg.Data})
		tree.Append(checkpoint.LeafHash(msg.Header, msg.Data))
	}
	b.Checkpoint = checkpointOf(t, &tree, b.Stream, keys["role.planner"], len(b.Events))
	return b
}

// TestAuditTrailForeignTypeIsTheSubjects: a tenant's write is judged by its subject,
// which the write service checked (a team writes its tools' event subjects, a client its
// identities'), never by the CloudEvents type it chose to send with it. Team calc (none
// of whose calls tester's run requested) and mallory write into the run on their own
// subjects: a message with no CloudEvents headers, a log typed as the run's outcome,
// mallory's answer typed as the planner's model.requested, a log naming another run in
// its runid, the core's signed call of another run stored as it is on calc's subject. Each is reported foreign and the
// run verifies (on main each failed the run: an empty or core type was judged).
// CONTROLS: the same headerless message on the core's own subject, and tester's own
// answer typed as the run's outcome (tester's answers count), fail decode.
func TestAuditTrailForeignTypeIsTheSubjects(t *testing.T) {
	const run = "bob-1"
	calcLog := events.ToolLogEvent("/toolbus/executor/calc", toolbus.ToolLog{RunID: run, CallID: "c9", Tool: "calc", Seq: 1})
	answer := func(who string) events.Envelope {
		return events.ToolAnswerEvent("/toolbus/client/"+who, toolbus.ToolAnswer{RunID: run, CallID: "x", Who: who, Seq: 1, Action: "accept"})
	}
	bare := func(m *nats.Msg) { m.Header, m.Data = nats.Header{}, []byte("junk") }
	typed := func(typ string) func(*nats.Msg) { return func(m *nats.Msg) { m.Header.Set("ce-type", typ) } }
	// A team sees the core's signed calls of its tool in its own runs, and may store one,
	// headers and data as they are, on its subject of any run.
	replayed := events.ToolRequestedEvent("/toolbus/planner/p1", toolbus.ToolRequested{RunID: "calc-own-run", Call: toolbus.ToolCall{CallID: "c1", Tool: "calc"}}, true)
	replayed.Subject = events.SubjectToolLog(run, "calc")
	for _, c := range []struct {
		what string
		s    stray
		edit func(*nats.Msg)
	}{
		{"team calc's headerless message", stray{calcLog, ""}, bare},
		{"team calc's log typed as the run's outcome", stray{calcLog, "team.calc"}, typed(events.TypeRunEnded(toolbus.RunCompleted))},
		{"team calc's log typed as a call the run never answered", stray{calcLog, "team.calc"}, typed(events.TypeToolRequested)},
		{"mallory's answer typed as a model.requested", stray{answer("mallory"), ""}, typed(events.TypeModelRequested)},
		{"team calc's log naming another run", stray{calcLog, "team.calc"}, func(m *nats.Msg) { m.Header.Set("ce-runid", "other") }},
		{"the core's signed event of another run, replayed on team calc's subject", stray{replayed, "role.planner"}, nil},
	} {
		res, err := trail.Verify(editedBundle(t, run, c.edit, c.s))
		if err != nil {
			t.Errorf("HOLE: %s fails tester's run: %v", c.what, err)
			continue
		}
		if len(res.Foreign) != 1 || res.Foreign[0].Index != 4 {
			t.Errorf("%s: want event 5 reported foreign, got %+v", c.what, res.Foreign)
		}
	}
	core := events.ModelRequestedEvent("/toolbus/injector/i1", toolbus.ModelRequested{RunID: run, Step: 1})
	mustFail(t, "a headerless message on the core's subject", editedBundle(t, run, bare, stray{core, ""}), "decode", 4)
	mustFail(t, "tester's own answer typed as the run's outcome", editedBundle(t, run, typed(events.TypeRunEnded(toolbus.RunCompleted)),
		stray{answer("tester"), "client.tester"}), "decode", 4)
}
