package trail_test

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// fixture is the bundle sdk/typescript's verifier test (audit-checkpoint.test.ts) checks.
const fixture = "../../sdk/typescript/test/fixtures/audit-bundle-checkpoint.json"

// TestAuditBundleFixture: the bundle the TypeScript verifier reads verifies here too,
// so both verifiers agree on one format. TOOLBUS_WRITE_FIXTURE=1 writes a new one (a
// client's run.started, the planner's model.requested, model.responded and
// run.completed, chained and signed, and a checkpoint over them).
func TestAuditBundleFixture(t *testing.T) {
	if os.Getenv("TOOLBUS_WRITE_FIXTURE") != "" {
		if err := fixtureBundle(t).WriteFile(fixture); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if code := trail.VerifyFile(fixture, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, &out)
	}
}

func fixtureBundle(t *testing.T) trail.Bundle {
	const run = "fixture-1"
	from := time.Now().Add(-time.Hour).UTC()
	keys := map[string]seal.KeyFile{}
	b := trail.Bundle{Format: trail.BundleFormat, Run: run, Stream: events.DefaultStream, Exported: time.Now().UTC()}
	for _, s := range []string{"role.planner", "client.tester"} {
		kf, err := seal.NewKeyFile(s)
		if err != nil {
			t.Fatal(err)
		}
		keys[s] = kf
		k := seal.Key{KeyID: kf.KeyID, Signer: s, Public: kf.Public(), Created: from}
		if s == "client.tester" {
			k.Identities = map[string][]seal.Span{"tester": {{From: from}}}
		}
		b.Keys.Keys = append(b.Keys.Keys, k)
	}
	user := toolbus.Message{Role: toolbus.RoleUser, Content: "hello"}
	evs := []struct {
		env    events.Envelope
		signer string
		parent int // index of the event it follows, -1 none
	}{
		{events.RunStartedEvent("/toolbus/client/tester", toolbus.RunStarted{RunID: run, Model: "test", Principal: toolbus.Principal{ID: "tester"}, Messages: []toolbus.Message{user}}), "client.tester", -1},
		{events.ModelRequestedEvent("/toolbus/injector/i1", toolbus.ModelRequested{RunID: run}), "role.planner", 0},
		{events.ModelRespondedEvent("/toolbus/planner/p1", toolbus.ModelResponded{RunID: run, Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "hi"}}), "role.planner", 1},
		{events.RunEndedEvent("/toolbus/planner/p1", 0, toolbus.RunEnded{RunID: run, Status: toolbus.RunCompleted, Answer: "hi"}), "role.planner", 1},
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
		if err := seal.SignerOf(keys[e.signer]).Sign(msg.Header, msg.Data); err != nil {
			t.Fatal(err)
		}
		b.Events = append(b.Events, trail.Record{Seq: uint64(i + 1), Subject: msg.Subject, Header: msg.Header, Data: msg.Data})
		tree.Append(checkpoint.LeafHash(msg.Header, msg.Data))
	}
	b.Checkpoint = checkpointOf(t, &tree, b.Stream, keys["role.planner"], len(b.Events))
	return b
}

// checkpointOf signs tree's head with key, as the core's checkpoint service does, and
// proves each of the n events (stream sequences 1 to n) in it.
func checkpointOf(t *testing.T, tree *checkpoint.Tree, stream string, key seal.KeyFile, n int) *checkpoint.Proofs {
	t.Helper()
	root, err := tree.Root(tree.Size())
	if err != nil {
		t.Fatal(err)
	}
	note, err := checkpoint.Checkpoint{Origin: checkpoint.Origin(stream), Size: tree.Size(), Root: root}.Sign(seal.SignerOf(key))
	if err != nil {
		t.Fatal(err)
	}
	proofs := &checkpoint.Proofs{Checkpoint: note}
	for i := range n {
		proof, err := tree.Prove(int64(i), tree.Size())
		if err != nil {
			t.Fatal(err)
		}
		l := checkpoint.Leaf{Seq: uint64(i + 1), Index: int64(i)}
		for _, h := range proof {
			l.Proof = append(l.Proof, h.String())
		}
		proofs.Leaves = append(proofs.Leaves, l)
	}
	return proofs
}
