package e2e_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/events"
)

// TestAuditCheckpointOutlivesRetention: the tree's tiles stored beside the checkpoints
// outlive the events. With its tiles removed (a deployment from before them) a
// restarted checkpoint service rebuilds them from a stream that starts at sequence 1.
// Then the stream's front (cp-1, every message before cp-2) is purged, as its
// retention expires it: a restarted service resumes from the tiles and the stream's
// messages after them, signs a checkpoint over a new message, which the stored hashes
// prove consistent with the one signed before; cp-2, whose events remain, exports and
// verifies offline (also with the tiles behind the latest checkpoint, when a restart
// resumes too), as does cp-1's bundle exported before. A tile altered stops a
// restarted service naming the tile, and an export fails on it (ErrTiles); with no tiles
// left and the front expired the service stops saying what is lost.
// CONTROL: the restarts before the tampering sign and stop nothing.
func TestAuditCheckpointOutlivesRetention(t *testing.T) {
	s, bundles, files := checkpointed(t)
	s.stop("checkpoint") // a service that stops stores its last tiles
	js := s.bus.JetStream()
	kv := must(js.KeyValue(s.ctx, checkpoint.Bucket))
	must(kv.Get(s.ctx, "tiles"))

	dropTiles(t, kv)
	mustSignCheckpoints(t, s)
	must(kv.Get(s.ctx, "tiles"))
	before := latestCheckpoint(t, s)
	tilesBefore := must(kv.Get(s.ctx, "tiles")).Value()

	first := bundles["cp-2"].Events[0].Seq
	rewrite(t, s, func(recs []trail.Record) []trail.Record { return recs },
		func(c *jetstream.StreamConfig) { c.DenyPurge = false })
	if err := must(js.Stream(s.ctx, s.bus.Config().Stream)).Purge(s.ctx, jetstream.WithPurgeSequence(first)); err != nil {
		t.Fatal(err)
	}
	if err := s.client.StartRun(s.ctx, events.Source("client", "tester"), toolbus.RunStarted{RunID: "cp-3", Model: "test",
		Principal: toolbus.Principal{ID: "tester"}, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "after"}}}); err != nil {
		t.Fatal(err)
	}
	if size, refused, logged := restartCheckpoints(t, s, "checkpoint-expired"); refused != "0" || logged != "" {
		t.Fatalf("after the front expired: %s %s, logged %q", size, refused, logged)
	}
	after := latestCheckpoint(t, s)
	signed, proof, err := checkpoint.Consistency(s.ctx, s.bus, before.Size)
	if err != nil || after.Size <= before.Size || !strings.HasPrefix(signed, after.Text()) {
		t.Fatalf("consistency: %v; the checkpoint after (%d) grew from %d", err, after.Size, before.Size)
	}
	if err := tlog.CheckTree(proof, after.Size, after.Root, before.Size, before.Root); err != nil {
		t.Fatalf("the checkpoint after the front expired is not consistent with the one before: %v", err)
	}
	mustVerifyOffline(t, must(trail.Collect(s.ctx, s.bus, "cp-2")))
	// The tiles behind the latest checkpoint (a core that stopped after signing, before
	// its next batch): the message after their last leaf comes from the stream.
	must(kv.Put(s.ctx, "tiles", tilesBefore))
	mustVerifyOffline(t, must(trail.Collect(s.ctx, s.bus, "cp-2")))
	if size, refused, logged := restartCheckpoints(t, s, "checkpoint-behind"); refused != "0" || logged != "" {
		t.Fatalf("tiles behind the latest checkpoint: %s %s, logged %q", size, refused, logged)
	}
	var out bytes.Buffer
	if code := trail.VerifyFile(files["cp-1"], &out); code != 0 {
		t.Fatalf("cp-1 exported before, offline: exit %d: %s", code, &out)
	}

	tile := must(kv.Get(s.ctx, "tile/8/0/000")).Value()
	altered := bytes.Clone(tile)
	altered[0] ^= 1
	must(kv.Put(s.ctx, "tile/8/0/000", altered))
	if _, refused, logged := restartCheckpoints(t, s, "checkpoint-tampered"); refused != "1" || !strings.Contains(logged, "tile/8/0/000") {
		t.Fatalf("a tile altered: refused %s, logged %q", refused, logged)
	} else {
		t.Log(strings.TrimSpace(logged))
	}
	if _, err := trail.Collect(s.ctx, s.bus, "cp-2"); !errors.Is(err, checkpoint.ErrTiles) || !strings.Contains(err.Error(), "tile/8/0/000") {
		t.Fatalf("export with a tile altered: %v, want ErrTiles naming the tile", err)
	}

	dropTiles(t, kv)
	if _, refused, logged := restartCheckpoints(t, s, "checkpoint-lost"); refused != "1" || !strings.Contains(logged, "Lost:") {
		t.Fatalf("no tiles and the front expired: refused %s, logged %q", refused, logged)
	} else {
		t.Log(strings.TrimSpace(logged))
	}
}

// dropTiles removes the stored tiles, as a deployment from before them has none.
func dropTiles(t *testing.T, kv jetstream.KeyValue) {
	t.Helper()
	keys := must(kv.ListKeys(t.Context()))
	for k := range keys.Keys() {
		if strings.HasPrefix(k, "tile") {
			if err := kv.Purge(t.Context(), k); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// latestCheckpoint is the core's latest checkpoint, opened with the stack's keys.
func latestCheckpoint(t *testing.T, s *signedStack) checkpoint.Checkpoint {
	t.Helper()
	c, _, err := checkpoint.Open(must(checkpoint.Latest(s.ctx, s.bus.JetStream())), s.ring)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mustVerifyOffline writes b to a file and wants it to verify with no bus.
func mustVerifyOffline(t *testing.T, b trail.Bundle) {
	t.Helper()
	file := filepath.Join(t.TempDir(), b.Run+".json")
	if err := b.WriteFile(file); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := trail.VerifyFile(file, &out); code != 0 {
		t.Fatalf("%s, offline: exit %d: %s", b.Run, code, &out)
	}
}
