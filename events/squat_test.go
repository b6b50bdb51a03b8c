package events_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
)

// everyEnvelope returns one envelope of every event type (and the deadline timer) of
// run, built by the constructors the workers publish with.
func everyEnvelope(t *testing.T, run string) []events.Envelope {
	t.Helper()
	call := toolbus.ToolCall{CallID: "call_1", Tool: "lookup", Arguments: `{}`}
	res := toolbus.ToolResult{CallID: call.CallID, Tool: call.Tool, Status: toolbus.StatusSucceeded, Content: "ok"}
	const src = "/toolbus/test/1"
	envs := []events.Envelope{
		events.RunStartedEvent(src, toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: "carol"}}),
		events.TimerEvent(src, events.RunTimer{RunID: run, Deadline: time.Unix(1e9, 0).UTC()}),
		events.ModelRequestedEvent(src, toolbus.ModelRequested{RunID: run, Step: 1}),
		events.ModelRespondedEvent(src, toolbus.ModelResponded{RunID: run, Step: 1}),
		events.ToolRequestedEvent(src, toolbus.ToolRequested{RunID: run, Step: 1, CallIndex: 0, CallCount: 1, Call: call}, true),
		events.ToolRequestedEvent(src, toolbus.ToolRequested{RunID: run, Step: 1, CallIndex: 0, CallCount: 1, Call: call, Approved: true}, true),
		events.ToolFinishedEvent(src, toolbus.ToolFinished{RunID: run, Step: 1, CallIndex: 0, CallCount: 1, ToolResult: res}),
		events.ToolWaitingEvent(src, toolbus.ToolWaiting{RunID: run, Step: 1, CallIndex: 0, CallCount: 1, Call: call}),
		events.ToolProgressEvent(src, toolbus.ToolProgress{RunID: run, Step: 1, CallID: call.CallID, Tool: call.Tool, Attempt: 1, Seq: 1, Done: 1}),
		events.ToolLogEvent(src, toolbus.ToolLog{RunID: run, Step: 1, CallID: call.CallID, Tool: call.Tool, Attempt: 1, Seq: 1, Level: "info", Message: "m"}),
		events.ToolQuestionEvent(src, toolbus.ToolQuestion{RunID: run, Step: 1, CallID: call.CallID, Tool: call.Tool, Attempt: 1, Seq: 1, Message: "q", Schema: []byte(`{"type":"object"}`)}),
		events.ToolAnswerEvent(src, toolbus.ToolAnswer{RunID: run, Step: 1, CallID: call.CallID, Tool: call.Tool, Attempt: 1, Seq: 1, Action: "cancel", Who: "bob"}),
		events.ApprovalEvent(src, 1, toolbus.Approval{RunID: run, CallID: call.CallID, Who: "bob"}, true),
		events.ApprovalEvent(src, 1, toolbus.Approval{RunID: run, CallID: call.CallID, Who: "bob"}, false),
		events.CancelEvent(src, toolbus.Cancel{RunID: run, Who: "alice"}),
	}
	for _, s := range []toolbus.RunStatus{toolbus.RunCompleted, toolbus.RunWaitingForApproval, toolbus.RunFailed,
		toolbus.RunLimitReached, toolbus.RunCancelled} {
		envs = append(envs, events.RunEndedEvent(src, 1, toolbus.RunEnded{RunID: run, Status: s, Pending: []toolbus.ToolCall{call}}))
	}
	covered := map[string]bool{}
	for _, e := range envs {
		covered[e.Meta.Type] = true
	}
	for _, typ := range events.EventTypes() {
		if !covered[typ] {
			t.Fatalf("no envelope of type %s", typ)
		}
	}
	return envs
}

// squatSubjects are subjects a client (run.started, run.cancel, approvals) and an
// executor (tool.finished, tool.waiting) may publish on, for a run of their own.
func squatSubjects(decoy string) map[string]string {
	return map[string]string{
		"client run.started":      events.SubjectRunStarted(decoy, ""),
		"client run.cancel":       events.SubjectRunCancel(decoy, ""),
		"client approval":         events.SubjectApproval(decoy, true, ""),
		"executor tool.finished":  events.SubjectToolFinished(decoy, "noop"),
		"executor tool.waiting":   events.SubjectToolWaiting(decoy, "noop"),
		"executor tool.progress":  events.SubjectToolProgress(decoy, "noop"),
		"executor tool.log":       events.SubjectToolLog(decoy, "noop"),
		"executor tool.question":  events.SubjectToolQuestion(decoy, "noop"),
		"client tool.answer":      events.SubjectToolAnswer(decoy, ""),
		"executor unknown result": events.SubjectToolFinished(decoy, "not a tool"),
	}
}

// squat publishes, on subject, a copy of e (same id, type and data) with e's id as its
// Nats-Msg-Id: what a party allowed on subject can send.
func squat(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string, e events.Envelope) {
	t.Helper()
	msg, err := events.Encode(subject, e.Meta, e.Data)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(e.Meta.ID))
	if err != nil || ack.Duplicate {
		t.Fatalf("squat %s on %s: %v (duplicate %v)", e.Meta.ID, subject, err, ack != nil && ack.Duplicate)
	}
}

// onSubject returns the events stored on subject with e's id.
func onSubject(t *testing.T, ctx context.Context, bus *events.Bus, e events.Envelope) []uint64 {
	t.Helper()
	var seqs []uint64
	for seq := uint64(1); ; {
		raw, err := bus.EventStream().GetMsg(ctx, seq, jetstream.WithGetMsgSubject(e.Subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return seqs
		}
		if err != nil {
			t.Fatal(err)
		}
		m, err := events.Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, nil)
		if err == nil && m.ID == e.Meta.ID && m.Type == e.Meta.Type {
			seqs = append(seqs, raw.Sequence)
		}
		seq = raw.Sequence + 1
	}
}

// Nothing a party publishes can suppress another's event: for every event type, a
// message carrying the event's id published first on a subject a client or an
// executor may use does not keep the event out of the stream, published synchronously
// or asynchronously. And re-publishing the event afterwards (a crash between publish
// and acknowledgement) still stores it once.
func TestSquattedIDDoesNotSuppressEvent(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	before := events.SquatsSeen()
	n := 0
	for who, subject := range squatSubjects("decoy") {
		for _, async := range []bool{false, true} {
			n++
			run := fmt.Sprintf("victim-%d", n)
			for _, e := range everyEnvelope(t, run) {
				t.Run(fmt.Sprintf("%s/async=%v/%s", who, async, e.Meta.Type), func(t *testing.T) {
					squat(t, ctx, bus.JetStream(), subject, e)
					publish := func() {
						t.Helper()
						if !async {
							if _, err := bus.PublishEvent(ctx, e); err != nil {
								t.Fatal(err)
							}
							return
						}
						f, err := bus.PublishEventAsync(ctx, e)
						if err != nil {
							t.Fatal(err)
						}
						if err := events.AwaitAcks(ctx, []*events.PubFuture{f}); err != nil {
							t.Fatal(err)
						}
					}
					publish()
					if got := onSubject(t, ctx, bus, e); len(got) != 1 {
						t.Fatalf("%s stored %d time(s) on %s after a squat on %s, want once", e.Meta.ID, len(got), e.Subject, subject)
					}
					// Re-published (crash-safe re-publishing): still once.
					publish()
					publish()
					if got := onSubject(t, ctx, bus, e); len(got) != 1 {
						t.Fatalf("%s stored %d time(s) after re-publishing, want once", e.Meta.ID, len(got))
					}
					if _, ok, err := bus.Stored(ctx, e); err != nil || !ok {
						t.Fatalf("Stored(%s) = %v, %v", e.Meta.ID, ok, err)
					}
				})
			}
		}
	}
	if seen := events.SquatsSeen() - before; seen < uint64(n) {
		t.Fatalf("%d squats reported, want at least %d", seen, n)
	}
}

// Crash-safe re-publishing: the same event published twice (even with another time
// and source, as a redelivered worker writes it) is stored once, and the second
// acknowledgement says duplicate.
func TestRepublishedEventStoredOnce(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	before := events.SquatsSeen()
	for _, e := range everyEnvelope(t, "again") {
		if ack, err := bus.PublishEvent(ctx, e); err != nil || ack.Duplicate {
			t.Fatalf("first publish of %s: %v (duplicate %v)", e.Meta.ID, err, ack != nil && ack.Duplicate)
		}
		again := e
		again.Meta.Source, again.Meta.Time = "/toolbus/test/2", time.Now().Add(time.Second)
		ack, err := bus.PublishEvent(ctx, again)
		if err != nil || !ack.Duplicate {
			t.Fatalf("second publish of %s: %v (duplicate %v), want a duplicate", e.Meta.ID, err, ack != nil && ack.Duplicate)
		}
		f, err := bus.PublishEventAsync(ctx, again)
		if err != nil {
			t.Fatal(err)
		}
		if ack, err := f.Wait(ctx); err != nil || !ack.Duplicate {
			t.Fatalf("async re-publish of %s: %v, want a duplicate", e.Meta.ID, err)
		}
		if got := onSubject(t, ctx, bus, e); len(got) != 1 {
			t.Fatalf("%s stored %d times, want once", e.Meta.ID, len(got))
		}
	}
	if events.SquatsSeen() != before {
		t.Fatal("a true duplicate was taken for a squat")
	}
}

// A client starting a run whose run.started id another client squatted (on its own
// run's subject) starts it: the squat is not taken for a concurrent submission.
func TestStartRunAfterSquat(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	rs := toolbus.RunStarted{RunID: "ticket-4711", Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}}
	squat(t, ctx, bus.JetStream(), events.SubjectRunStarted("decoy", ""), events.RunStartedEvent("/evil", rs))
	if err := bus.StartRun(ctx, "/test", rs); err != nil {
		t.Fatalf("StartRun after a squat: %v", err)
	}
	if got, err := bus.RunStarted(ctx, rs.RunID); err != nil || got.RunID != rs.RunID {
		t.Fatalf("RunStarted = %+v, %v", got, err)
	}
	if err := bus.StartRun(ctx, "/test", rs); !errors.Is(err, events.ErrRunExists) {
		t.Fatalf("second StartRun: %v, want ErrRunExists", err)
	}
}

// A squat on the event's own subject (which a client may use for any run's run.started
// or approvals) with the event's type and id, but data naming another run, is no event
// of this run: it suppresses nothing either.
func TestSquatOnOwnSubjectWithAnotherRunsData(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	rs := toolbus.RunStarted{RunID: "own-1", Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "q"}}}
	forged := events.RunStartedEvent("/evil", toolbus.RunStarted{RunID: "elsewhere"})
	forged.Meta.ID = events.IDRunStarted(rs.RunID)
	squat(t, ctx, bus.JetStream(), events.SubjectRunStarted(rs.RunID, ""), forged)
	if err := bus.StartRun(ctx, "/test", rs); err != nil {
		t.Fatalf("StartRun after a squat on its own subject: %v", err)
	}
	if got, err := bus.RunStarted(ctx, rs.RunID); err != nil || got.RunID != rs.RunID {
		t.Fatalf("RunStarted = %+v, %v", got, err)
	}
	approval := events.ApprovalEvent("/test", 0, toolbus.Approval{RunID: "own-1", CallID: "a", Who: "alice"}, true)
	fake := events.ApprovalEvent("/evil", 0, toolbus.Approval{RunID: "elsewhere", CallID: "a", Who: "mallory"}, true)
	fake.Meta.ID, fake.Meta.RunID = approval.Meta.ID, ""
	squat(t, ctx, bus.JetStream(), approval.Subject, fake)
	if _, err := bus.PublishEvent(ctx, approval); err != nil {
		t.Fatal(err)
	}
	seqs := onSubject(t, ctx, bus, approval)
	if len(seqs) != 2 { // the squat (same id, another run's data) and the real one
		t.Fatalf("%d messages with the approval's id on its subject, want the squat and the real one", len(seqs))
	}
	if _, ok, err := bus.Stored(ctx, approval); err != nil || !ok {
		t.Fatalf("the real approval is not stored: %v, %v", ok, err)
	}
}

// Subject and body agree: the envelope of every event type passes CheckSubject, and
// each way a subject can disagree with its event (another run, another tool, another
// outcome or approval type, attributes naming another run or call) is a
// *MismatchError wrapping ErrSubjectMismatch and ErrPoison (consumers terminate it).
func TestCheckSubject(t *testing.T) {
	for _, e := range everyEnvelope(t, "run-a") {
		t.Run(e.Meta.Type, func(t *testing.T) {
			check := func(subject string, m events.Meta, data any) error {
				msg, err := events.Encode(subject, m, data)
				if err != nil {
					t.Fatal(err)
				}
				v := events.DataOf(m.Type)
				got, err := events.Decode(msg, v)
				if err != nil {
					t.Fatal(err)
				}
				return events.CheckSubject(subject, got, v)
			}
			if err := check(e.Subject, e.Meta, e.Data); err != nil {
				t.Fatalf("the constructor's envelope: %v", err)
			}
			mismatch := func(what string, err error) {
				t.Helper()
				var me *events.MismatchError
				if !errors.As(err, &me) || !errors.Is(err, events.ErrSubjectMismatch) || !errors.Is(err, events.ErrPoison) {
					t.Errorf("%s: %v, want a subject mismatch", what, err)
				}
			}
			run, _ := events.RunIDFromSubject(e.Subject)
			rest := e.Subject[len("toolbus."+run+"."):]
			mismatch("another run's subject", check("toolbus.decoy."+rest, e.Meta, e.Data))
			m := e.Meta
			m.RunID = "decoy"
			mismatch("runid attribute", check(e.Subject, m, e.Data))
			if m := e.Meta; m.CallID != "" {
				m.CallID = "call_other"
				mismatch("callid attribute", check(e.Subject, m, e.Data))
			}
			for _, other := range everyEnvelope(t, "run-a") {
				if other.Meta.Type == e.Meta.Type {
					continue
				}
				// Another event's data on this subject (an approval.granted typed event on
				// the denied subject, a completed outcome on failed...).
				mismatch("a "+other.Meta.Type+" on "+e.Subject, check(e.Subject, other.Meta, other.Data))
			}
			if tf, ok := e.Data.(toolbus.ToolFinished); ok {
				// The result of a validly named tool is on its tool's subject only, even
				// the planner's unknown_tool answer: no result subject is shared by teams.
				unknown := tf
				unknown.Status, unknown.Error = toolbus.StatusRejected, &toolbus.ToolError{Code: toolbus.CodeUnknownTool, Message: "no executor serves it"}
				mismatch("an unknown_tool rejection on the _unknown subject", check(events.SubjectToolFinished(run, "_unknown"), e.Meta, unknown))
				if err := check(events.SubjectToolFinished(run, tf.Tool), e.Meta, unknown); err != nil {
					t.Errorf("an unknown_tool rejection on the tool's subject: %v", err)
				}
				forged := tf
				forged.Status, forged.Error, forged.Content = toolbus.StatusSucceeded, nil, "forged by another team"
				mismatch("a succeeded result on the _unknown subject", check(events.SubjectToolFinished(run, "_unknown"), e.Meta, forged))
				invalid := unknown
				invalid.Tool = "not a tool"
				if err := check(events.SubjectToolFinished(run, "_unknown"), e.Meta, invalid); err != nil {
					t.Errorf("the result of an invalid tool name on the _unknown subject: %v", err)
				}
				tf.Tool = "other_tool"
				mismatch("another tool", check(e.Subject, e.Meta, tf))
			}
			if tr, ok := e.Data.(toolbus.ToolRequested); ok {
				if err := check(events.SubjectToolRequested(run, "_unknown"), e.Meta, tr); err != nil {
					t.Errorf("a call on the _unknown queue: %v", err)
				}
				tr.Call.Tool = "other_tool"
				mismatch("another tool", check(e.Subject, e.Meta, tr))
			}
			if tw, ok := e.Data.(toolbus.ToolWaiting); ok {
				tw.Call.Tool = "other_tool"
				mismatch("another tool", check(e.Subject, e.Meta, tw))
			}
			switch e.Data.(type) {
			case toolbus.RunStarted, toolbus.Approval, toolbus.Cancel:
				// The identity token is what the server bound to the publisher's credentials:
				// a body claiming another identity, or a subject without one, is a mismatch.
				base := e.Subject[:strings.LastIndexByte(e.Subject, '.')]
				mismatch("another identity's subject", check(base+".mallory", e.Meta, e.Data))
				mismatch("no identity token", check(base, e.Meta, e.Data))
				mismatch("the none token", check(base+"."+events.NoIdentityToken, e.Meta, e.Data))
				mismatch("two tokens", check(e.Subject+".x", e.Meta, e.Data))
			}
			if re, ok := e.Data.(toolbus.RunEnded); ok {
				re.Status = toolbus.RunCompleted
				if e.Meta.Type != events.TypeRunEnded(toolbus.RunCompleted) {
					mismatch("another status", check(e.Subject, e.Meta, re))
				}
			}
		})
	}
}

// A forged run.started or run.cancel whose body names another run does not count: it
// does not take the run id (the real run.started after it starts the run) and is not
// the run's cancellation; readers see it as a mismatch.
func TestForgedFirstEventsDoNotCount(t *testing.T) {
	bus := openBus(t)
	ctx := eventstest.Context(t, time.Minute)
	forged := events.RunStartedEvent("/evil", toolbus.RunStarted{RunID: "victim"})
	if _, err := bus.Publish(ctx, events.SubjectRunStarted("decoy", ""), forged.Meta, forged.Data); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.RunStarted(ctx, "decoy"); !errors.Is(err, events.ErrRunNotFound) {
		t.Fatalf("a run.started naming another run started decoy: %v", err)
	}
	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: "decoy"}); err != nil {
		t.Fatalf("the real run.started: %v", err)
	}
	if rs, err := bus.RunStarted(ctx, "decoy"); err != nil || rs.RunID != "decoy" {
		t.Fatalf("RunStarted(decoy) = %+v, %v", rs, err)
	}
	cancel := events.CancelEvent("/evil", toolbus.Cancel{RunID: "victim", Who: "mallory"})
	if _, err := bus.Publish(ctx, events.SubjectRunCancel("decoy", "mallory"), cancel.Meta, cancel.Data); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := runlog.CancelRequest(ctx, bus, "decoy"); err != nil || ok {
		t.Fatalf("CancelRequest(decoy) = %+v, %v, %v: a cancel naming another run counted", c, ok, err)
	}
	if _, err := bus.PublishCancel(ctx, "/test", toolbus.Cancel{RunID: "decoy", Who: "alice"}); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := runlog.CancelRequest(ctx, bus, "decoy"); err != nil || !ok || c.Who != "alice" {
		t.Fatalf("CancelRequest(decoy) = %+v, %v, %v", c, ok, err)
	}
	// Readers flag both forgeries and only them.
	evs, err := runlog.Events(ctx, bus, "decoy")
	if err != nil {
		t.Fatal(err)
	}
	var flagged []string
	for _, ev := range evs {
		if ev.Err != nil {
			if !errors.Is(ev.Err, events.ErrSubjectMismatch) {
				t.Errorf("#%d: %v", ev.Seq, ev.Err)
			}
			flagged = append(flagged, ev.Meta.Type)
		}
	}
	if len(evs) != 4 || len(flagged) != 2 || flagged[0] != events.TypeRunStarted || flagged[1] != events.TypeRunCancel {
		t.Fatalf("%d events, flagged %v; want 4 with the forged run.started and run.cancel flagged", len(evs), flagged)
	}
}
