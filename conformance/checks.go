package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	sjs "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
)

// checkCatalog checks the tool's contract and that a live instance serves it; false
// when there is none (nothing else can be checked).
func (s *suite) checkCatalog() bool {
	ctx, bus, tool := s.ctx, s.bus, s.cfg.Tool
	if err := poll(ctx, func() error {
		cs, err := bus.Store().Contracts(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(cs, func(c toolbus.ToolContract) bool { return c.Name == tool }) {
			return fmt.Errorf("no %s in the catalog (KV %s)", tool, store.BucketTools)
		}
		ins, err := bus.Store().Instances(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(ins, func(in store.Instance) bool { return slices.Contains(in.Tools, tool) }) {
			return fmt.Errorf("no live instance serving %s (KV %s)", tool, store.BucketInstances)
		}
		return nil
	}); err != nil {
		s.fail("catalog: %v", err)
		return false
	}
	checkContract(ctx, bus, tool, s.fail)
	return true
}

// checkResults checks the stored result of every case, then waits for the queue to be
// idle. A live executor acks every call or sends heartbeats while it runs: the queue
// never redelivers a call here (sampled while the results come in and until the queue
// is idle).
func (s *suite) checkResults() {
	ctx, tool := s.ctx, s.cfg.Tool
	for _, c := range s.calls {
		run := s.runOf(c)
		var msg *nats.Msg
		err := poll(ctx, func() error {
			_, _ = s.sample()
			var err error
			msg, err = storedResult(ctx, s.bus, run, tool)
			return err
		})
		if err != nil {
			s.fail("%s: no tool.finished in the stream: %v", c.name, err)
			continue
		}
		checkResult(msg, run, tool, c, s.schema, s.cfg.Accounts, func(format string, args ...any) {
			s.fail(c.name+": "+format, args...)
		})
	}
	// Wait for the queue to be idle (nothing pending, nothing unacknowledged), so a late
	// second result of a redelivered call is counted by checkCounts.
	if err := poll(ctx, func() error {
		q, err := s.sample()
		if err != nil {
			return err
		}
		if q.Pending > 0 || q.InFlight > 0 {
			return fmt.Errorf("queue of %s: %d pending, %d unacknowledged", tool, q.Pending, q.InFlight)
		}
		return nil
	}); err != nil {
		s.fail("the queue never became idle (every call must be acknowledged once its result is stored): %v", err)
	}
	if s.redelivered > 0 {
		s.fail("the queue redelivered %d call(s) while the executor lived: the executor sent no heartbeats (working/InProgress) during a call longer than the ack wait, or did not ack", s.redelivered)
	}
}

// checkProgress checks progress, where the executor reports it: only while the call
// runs (before its result), on the call's subject with data that agrees, in sequence.
func (s *suite) checkProgress() error {
	for _, c := range s.calls {
		n, err := checkProgress(s.ctx, s.bus, s.runOf(c), c.name, func(format string, args ...any) { s.fail(c.name+": "+format, args...) })
		if err != nil {
			return err
		}
		s.rep.Progress += n
	}
	return nil
}

// checkCounts checks exactly one result per call, both published and stored, and none
// for the poison message or the call whose subject and data disagree.
func (s *suite) checkCounts() error {
	ctx, bus := s.ctx, s.bus
	if err := s.checkProgress(); err != nil {
		return err
	}
	for _, c := range s.calls {
		run := s.runOf(c)
		s.mu.Lock()
		n := len(s.published[run+"/0/"+c.name])
		s.mu.Unlock()
		// A squatted result is published twice: once under its id, which the stream
		// drops (the squat holds the id), once under the per-subject guard.
		if n != 1 && !(c.squat && n == 2) {
			s.fail("%s: %d tool.finished published for one call, want exactly 1", c.name, n)
		}
		if stored, err := countStored(ctx, bus, run); err != nil {
			return err
		} else if stored != 1 {
			s.fail("%s: %d tool.finished stored for one call, want exactly 1", c.name, stored)
		}
	}
	if n, err := countStored(ctx, bus, s.poisonRun()); err != nil {
		return err
	} else if n != 0 {
		s.fail("poison: %d tool.finished for a message that is not a CloudEvent", n)
	}
	mismatch := s.mismatchRuns()
	for _, run := range mismatch {
		if n, err := countStored(ctx, bus, run); err != nil {
			return err
		} else if n != 0 {
			s.fail("subject and body disagree: %d tool.finished for a call whose subject names run %s and data run %s (it must be terminated, not run)",
				n, mismatch[0], mismatch[1])
		}
	}
	return nil
}

// storedResult returns the first tool.finished of a run in the stream.
func storedResult(ctx context.Context, bus *events.Bus, run, tool string) (*nats.Msg, error) {
	raw, err := bus.EventStream().GetLastMsgForSubject(ctx, events.SubjectToolFinished(run, tool))
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(raw.Subject)
	m.Header, m.Data = raw.Header, raw.Data
	return m, nil
}

// countStored counts the tool.finished events of a run in the stream.
func countStored(ctx context.Context, bus *events.Bus, run string) (int, error) {
	evs, err := runlog.Read(ctx, bus.EventStream(), events.SubjectToolFinishedAny(run))
	if err != nil {
		return 0, fmt.Errorf("conformance: %w", err)
	}
	return len(evs), nil
}

// checkProgress checks the tool.progress events of one call's run and returns how
// many there are.
func checkProgress(ctx context.Context, bus *events.Bus, run, callID string, fail func(string, ...any)) (int, error) {
	evs, err := runlog.Read(ctx, bus.EventStream(), events.SubjectRun(run))
	if err != nil {
		return 0, err
	}
	n, finished, lastSeq := 0, false, 0
	for _, ev := range evs {
		switch ev.Meta.Type {
		case events.TypeToolFinished:
			finished = true
		case events.TypeToolProgress:
			n++
			if ev.Err != nil {
				fail("tool.progress on %s: %v", ev.Subject, ev.Err)
				continue
			}
			var tp toolbus.ToolProgress
			if err := json.Unmarshal(ev.Data, &tp); err != nil {
				fail("tool.progress data does not decode: %v", err)
				continue
			}
			switch {
			case finished:
				fail("tool.progress %d published after the call's tool.finished: progress is only for a running call", tp.Seq)
			case tp.CallID != callID || tp.Step != 0:
				fail("tool.progress names call %q of step %d, want %q of step 0", tp.CallID, tp.Step, callID)
			case tp.Seq <= lastSeq:
				fail("tool.progress seq %d after %d: want increasing", tp.Seq, lastSeq)
			case ev.Meta.ID != events.IDToolProgress(run, 0, callID, tp.Attempt, tp.Seq):
				fail("tool.progress id %q, want %q", ev.Meta.ID, events.IDToolProgress(run, 0, callID, tp.Attempt, tp.Seq))
			}
			lastSeq = tp.Seq
		}
	}
	return n, nil
}

// checkContract checks the tool's catalog entry.
func checkContract(ctx context.Context, bus *events.Bus, tool string, fail func(string, ...any)) {
	cs, err := bus.Store().Contracts(ctx)
	if err != nil {
		fail("catalog: %v", err)
		return
	}
	for _, c := range cs {
		if c.Name != tool {
			continue
		}
		if c.Description == "" {
			fail("catalog: %s has no description (the model reads it)", tool)
		}
		doc, err := sjs.UnmarshalJSON(bytes.NewReader(c.InputSchema))
		if err != nil {
			fail("catalog: %s input_schema is not JSON: %v", tool, err)
			return
		}
		comp := sjs.NewCompiler()
		if err := comp.AddResource("mem://input.json", doc); err != nil {
			fail("catalog: %s input_schema: %v", tool, err)
			return
		}
		if _, err := comp.Compile("mem://input.json"); err != nil {
			fail("catalog: %s input_schema is not a JSON Schema: %v", tool, err)
		}
	}
}

// checkResult checks one stored tool.finished: attributes, ids, data and outcome.
func checkResult(msg *nats.Msg, run, tool string, c call, schema *sjs.Schema, accounts bool, fail func(string, ...any)) {
	wantID := events.IDToolFinished(run, 0, c.name)
	h := func(k string) string { return msg.Header.Get(k) }
	if accounts {
		// In a team account the message id is keyed by the team's credentials
		// (CONTRACT.md, "Team accounts"): the id, the guard and 22 characters of HMAC, so
		// that no other team can take it first.
		got := h(events.HeaderMsgID)
		if suffix, ok := strings.CutPrefix(got, wantID+events.GuardedIDSeparator); !ok || len(suffix) != 22 {
			fail("header %s = %q, want %q followed by 22 characters keyed by the team's credentials", events.HeaderMsgID, got, wantID+events.GuardedIDSeparator)
		}
		msg.Header.Set(events.HeaderMsgID, wantID)
	}
	if c.squat {
		// Stored under the per-subject guard: the id another message took, plus a random
		// suffix (CONTRACT.md, "A duplicate is the same event").
		if got := h(events.HeaderMsgID); !strings.HasPrefix(got, wantID+events.GuardedIDSeparator) {
			fail("header %s = %q, want %q followed by a random suffix (its id was squatted)", events.HeaderMsgID, got, wantID+events.GuardedIDSeparator)
		}
		msg.Header.Set(events.HeaderMsgID, wantID)
	}
	for k, want := range map[string]string{
		"ce-specversion": "1.0", "ce-type": events.TypeToolFinished, "ce-id": wantID, events.HeaderMsgID: wantID,
		"ce-dataschema": events.DataSchema(events.TypeToolFinished), "ce-subject": c.name, "ce-runid": run,
		"ce-step": "0", "ce-callid": c.name, "ce-callindex": "0", "ce-callcount": "1",
		"Content-Type": events.ContentTypeJSON,
	} {
		if got := h(k); got != want {
			fail("header %s = %q, want %q", k, got, want)
		}
	}
	if !strings.HasPrefix(h("ce-source"), "/toolbus/") {
		fail("ce-source %q is not /toolbus/<component>/<instance>", h("ce-source"))
	}
	if _, err := time.Parse(time.RFC3339Nano, h("ce-time")); err != nil {
		fail("ce-time %q: %v", h("ce-time"), err)
	}
	if want := events.SubjectToolFinished(run, tool); msg.Subject != want {
		fail("subject %s, want %s", msg.Subject, want)
	}
	doc, err := sjs.UnmarshalJSON(bytes.NewReader(msg.Data))
	if err != nil {
		fail("data is not JSON: %v", err)
		return
	}
	if err := schema.Validate(doc); err != nil {
		fail("data does not validate against %s: %v\n%s", events.SchemaFile(events.TypeToolFinished), err, msg.Data)
	}
	var tf toolbus.ToolFinished
	if _, err := events.Decode(msg, &tf); err != nil {
		fail("decode: %v", err)
		return
	}
	if tf.RunID != run || tf.Step != 0 || tf.CallIndex != 0 || tf.CallCount != 1 || tf.CallID != c.name || tf.Tool != tool {
		fail("position or call %+v, want run %s step 0 call 0 of 1, call %s tool %s", tf, run, c.name, tool)
	}
	if tf.Status != c.wantStatus || tf.Code() != c.wantCode {
		fail("status %s code %q (%s), want %s %q", tf.Status, tf.Code(), errMessage(tf.ToolResult), c.wantStatus, c.wantCode)
	}
	if tf.Status == toolbus.StatusSucceeded && tf.Content == "" {
		fail("a succeeded result with no content for the model")
	}
	if tf.Status != toolbus.StatusSucceeded && (tf.Error == nil || tf.Error.Message == "") {
		fail("a %s result without an error message", tf.Status)
	}
	if c.wantAttempt > 0 && tf.Attempt != c.wantAttempt {
		fail("attempt %d, want %d: a call claimed by an executor that is gone is taken over with the next attempt", tf.Attempt, c.wantAttempt)
	}
	if c.long && tf.Attempt != 1 {
		fail("a call longer than two ack waits ran at attempt %d: the executor sent no heartbeats (working/InProgress) and it was redelivered", tf.Attempt)
	}
	if tf.Attempt < 1 || tf.Executor == "" {
		fail("attempt %d executor %q: both are required", tf.Attempt, tf.Executor)
	}
}

func errMessage(r toolbus.ToolResult) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Message
}

// resultSchema compiles the schema of tool.finished data from the repository's schemas/.
func resultSchema() (*sjs.Schema, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return nil, errors.New("conformance: cannot locate schemas/")
	}
	path := filepath.Join(filepath.Dir(file), "..", "schemas", events.SchemaFile(events.TypeToolFinished))
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	defer f.Close()
	doc, err := sjs.UnmarshalJSON(f)
	if err != nil {
		return nil, fmt.Errorf("conformance: %s: %w", path, err)
	}
	c := sjs.NewCompiler()
	id := events.DataSchema(events.TypeToolFinished)
	if err := c.AddResource(id, doc); err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	return c.Compile(id)
}
