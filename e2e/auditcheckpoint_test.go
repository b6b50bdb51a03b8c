package e2e_test

import (
	"bytes"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/events"
)

// checkpointed runs two signed runs and returns the stack and their bundles, each
// checked to verify live (replay --verify) and exported, offline (audit verify): the
// CONTROL of the tamperings that follow.
func checkpointed(t *testing.T) (*signedStack, map[string]trail.Bundle, map[string]string) {
	s := newSignedStack(t, twoCalls())
	s.startAll()
	bundles, files := map[string]trail.Bundle{}, map[string]string{}
	for _, run := range []string{"cp-1", "cp-2"} {
		s.run(run)
		bundles[run] = s.collect(run)
	}
	for run, b := range bundles {
		files[run] = filepath.Join(t.TempDir(), run+".json")
		if err := b.WriteFile(files[run]); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if code := trail.VerifyFile(files[run], &out); code != 0 {
			t.Fatalf("untouched %s, offline: exit %d: %s", run, code, &out)
		}
		out.Reset()
		if code := trail.VerifyLive(s.ctx, s.bus, run, &out, true); code != 0 {
			t.Fatalf("untouched %s, live: exit %d: %s", run, code, &out)
		}
	}
	return s, bundles, files
}

// rewrite is the administrator rewriting the stream's past, the one way its
// credentials allow (the stream denies deletes and purges, and no update lifts that):
// every message read, the stream deleted and created again with its configuration, and
// the messages edit returns stored again (the configuration changed by each of cfgs
// first). It returns them with their new sequences.
func rewrite(t *testing.T, s *signedStack, edit func([]trail.Record) []trail.Record, cfgs ...func(*jetstream.StreamConfig)) []trail.Record {
	t.Helper()
	js, name := s.bus.JetStream(), s.bus.Config().Stream
	if r := s.bus.Reader().CachedInfo().Config.Name; r != name {
		t.Fatalf("the stack reads %s, not the event stream %s", r, name)
	}
	st := must(js.Stream(s.ctx, name))
	cfg := st.CachedInfo().Config
	cons := must(st.OrderedConsumer(s.ctx, jetstream.OrderedConsumerConfig{}))
	n := int(must(cons.Info(s.ctx)).NumPending)
	var recs []trail.Record
	for len(recs) < n {
		batch := must(cons.Fetch(n-len(recs), jetstream.FetchMaxWait(5*time.Second)))
		for m := range batch.Messages() {
			recs = append(recs, trail.Record{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		}
	}
	if err := js.DeleteStream(s.ctx, name); err != nil {
		t.Fatal(err)
	}
	for _, f := range cfgs {
		f(&cfg)
	}
	if _, err := js.CreateStream(s.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	out := edit(recs)
	for i, r := range out {
		ack := must(js.PublishMsg(s.ctx, &nats.Msg{Subject: r.Subject, Header: maps.Clone(nats.Header(r.Header)), Data: r.Data}))
		out[i].Seq = ack.Sequence
	}
	return out
}

// mustDetect wants replay --verify of run to fail on the checkpoint, and the run's
// bundle exported before (the witness's copy) still to verify offline.
func mustDetect(t *testing.T, s *signedStack, run, file string) {
	t.Helper()
	if _, err := trail.Collect(s.ctx, s.bus, run); !errors.Is(err, checkpoint.ErrRewritten) {
		t.Fatalf("collect %s: %v, want ErrRewritten", run, err)
	}
	var out bytes.Buffer
	if code := trail.VerifyLive(s.ctx, s.bus, run, &out, true); code != 1 || !strings.Contains(out.String(), "checkpoint") {
		t.Fatalf("replay --verify %s: exit %d: %s", run, code, &out)
	}
	t.Log(strings.TrimSpace(out.String()))
	out.Reset()
	if code := trail.VerifyFile(file, &out); code != 0 {
		t.Fatalf("the exported %s, offline: exit %d: %s", run, code, &out)
	}
}

// TestAuditCheckpointRunRemoved: a run the administrator removed whole (the stream
// rewritten without it) leaves no event to check, yet replay --verify
// fails: the stream no longer hashes to the core's signed checkpoint, and the core's
// checkpoint service, restarted, stops signing and shows it (metric, error log).
// CONTROL: before, both runs verify live and offline and a restarted service signs.
func TestAuditCheckpointRunRemoved(t *testing.T) {
	s, _, files := checkpointed(t)
	mustSignCheckpoints(t, s)
	rewrite(t, s, func(recs []trail.Record) []trail.Record {
		return slices.DeleteFunc(recs, func(r trail.Record) bool { return strings.HasPrefix(r.Subject, "toolbus.cp-1.") })
	})
	mustDetect(t, s, "cp-1", files["cp-1"])
	mustDetect(t, s, "cp-2", files["cp-2"])
	mustStopCheckpoints(t, s)
}

// TestAuditCheckpointRewrittenPast: the administrator moves a past event (cp-1's
// run.completed stored again unchanged, at the stream's end): its signature and its
// run's chain still hold, but the stream no longer hashes to the signed checkpoint,
// live; offline, the moved event has no inclusion proof, and one proven at another
// event's place fails; a restarted checkpoint service stops signing and shows it.
// CONTROL: the untouched runs verify.
func TestAuditCheckpointRewrittenPast(t *testing.T) {
	s, bundles, files := checkpointed(t)
	b := bundles["cp-1"]
	i := index(t, b, events.TypeRunEnded(toolbus.RunCompleted), "")
	id := b.Events[i].Header["ce-id"][0]
	recs := rewrite(t, s, func(recs []trail.Record) []trail.Record {
		j := slices.IndexFunc(recs, func(r trail.Record) bool { return r.Header["ce-id"][0] == id })
		r := recs[j]
		return append(slices.Delete(recs, j, j+1), r)
	})
	mustDetect(t, s, "cp-1", files["cp-1"])
	mustStopCheckpoints(t, s)

	moved := clone(b)
	moved.Events[i].Seq = recs[len(recs)-1].Seq
	mustFail(t, "event moved in the stream", moved, "checkpoint", i)
	elsewhere := clone(b)
	elsewhere.Events[i].Seq = b.Events[i-1].Seq // another event's proof
	mustFail(t, "event proven at another's place", elsewhere, "checkpoint", i)
}
