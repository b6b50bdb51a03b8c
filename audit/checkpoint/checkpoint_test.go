package checkpoint_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/events/seal"
)

// TestCheckpointProofs: a signed checkpoint opens with the core's key and every leaf's
// proof checks against it; an altered leaf, a leaf at another index, a checkpoint
// signed by a team's key or with its size altered fail.
func TestCheckpointProofs(t *testing.T) {
	core, _ := seal.NewKeyFile("role.planner")
	team, _ := seal.NewKeyFile("team.alpha")
	ring := seal.Keyring{}
	for _, k := range []seal.KeyFile{core, team} {
		ring.Keys = append(ring.Keys, seal.Key{KeyID: k.KeyID, Signer: k.Signer, Public: k.Public(), Created: time.Now()})
	}
	var tree checkpoint.Tree
	leaf := func(i int) tlog.Hash {
		return checkpoint.LeafHash(map[string][]string{"ce-id": {fmt.Sprint(i)}}, []byte("data"))
	}
	for i := range 11 {
		tree.Append(leaf(i))
	}
	root, err := tree.Root(11)
	if err != nil {
		t.Fatal(err)
	}
	c := checkpoint.Checkpoint{Origin: checkpoint.Origin("TOOLBUS"), Size: 11, Root: root}
	signed, err := c.Sign(seal.SignerOf(core))
	if err != nil {
		t.Fatal(err)
	}
	p := &checkpoint.Proofs{Checkpoint: signed}
	for i := range 11 {
		pr, err := tree.Prove(int64(i), 11)
		if err != nil {
			t.Fatal(err)
		}
		l := checkpoint.Leaf{Seq: uint64(i + 1), Index: int64(i)}
		for _, h := range pr {
			l.Proof = append(l.Proof, h.String())
		}
		p.Leaves = append(p.Leaves, l)
	}
	got, signer, err := p.Check(ring, "TOOLBUS")
	if err != nil || signer != core.KeyID || got != c {
		t.Fatalf("check: %v %s %v", err, signer, got)
	}
	for i := range 11 {
		if why := p.Includes(got, uint64(i+1), leaf(i)); why != "" {
			t.Fatalf("leaf %d: %s", i, why)
		}
	}
	if why := p.Includes(got, 3, leaf(7)); why == "" {
		t.Fatal("a leaf proven at another's index")
	}
	if why := p.Includes(got, 3, checkpoint.LeafHash(map[string][]string{"ce-id": {"2"}}, []byte("dat4"))); why == "" {
		t.Fatal("an altered leaf is included")
	}
	if why := p.Includes(got, 99, leaf(0)); why == "" {
		t.Fatal("a message after the checkpoint is included")
	}
	byTeam, _ := c.Sign(seal.SignerOf(team))
	if _, _, err := (&checkpoint.Proofs{Checkpoint: byTeam}).Check(ring, "TOOLBUS"); err == nil {
		t.Fatal("a checkpoint signed by a team verifies")
	}
	if _, _, err := (&checkpoint.Proofs{Checkpoint: strings.Replace(signed, "\n11\n", "\n12\n", 1)}).Check(ring, "TOOLBUS"); err == nil {
		t.Fatal("an altered checkpoint verifies")
	}
	if _, _, err := p.Check(ring, "OTHER"); err == nil {
		t.Fatal("another stream's checkpoint verifies")
	}
}
