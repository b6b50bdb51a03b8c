package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
)

// Envelope is one event ready to publish: its NATS subject, its CloudEvents attributes
// and its data. The constructors below (one per event type) derive the subject, the id,
// the type and the run, step and call extensions from the data, so they cannot disagree
// with it; every toolbus worker publishes through them. Bus.Publish remains for
// clients and tests that need to write an event by hand.
type Envelope struct {
	Subject string
	Meta    Meta
	Data    any
}

// Traced returns e with the W3C traceparent of the run in its traceparent extension.
func (e Envelope) Traced(traceparent string) Envelope {
	e.Meta.TraceParent = traceparent
	return e
}

// RunStartedEvent is the run.started event submitting rs.
func RunStartedEvent(source string, rs toolbus.RunStarted) Envelope {
	return Envelope{SubjectRunStarted(rs.RunID, rs.Principal.ID),
		Meta{ID: IDRunStarted(rs.RunID), Type: TypeRunStarted, Source: source, RunID: rs.RunID}, rs}
}

// ModelRequestedEvent is the model.requested event of a step.
func ModelRequestedEvent(source string, mr toolbus.ModelRequested) Envelope {
	return Envelope{SubjectModelRequested(mr.RunID),
		Meta{ID: IDModelRequested(mr.RunID, mr.Step), Type: TypeModelRequested, Source: source, RunID: mr.RunID, Step: mr.Step}, mr}
}

// ModelRespondedEvent is the model.responded event of a step.
func ModelRespondedEvent(source string, mr toolbus.ModelResponded) Envelope {
	return Envelope{SubjectModelResponded(mr.RunID),
		Meta{ID: IDModelResponded(mr.RunID, mr.Step), Type: TypeModelResponded, Source: source, RunID: mr.RunID, Step: mr.Step}, mr}
}

// ToolRequestedEvent is the tool.requested event of one call. served is false for a
// call no executor serves: its subject carries UnknownToolToken, so any executor
// rejects it. A call re-issued after an approval (tr.Approved) has its own id.
func ToolRequestedEvent(source string, tr toolbus.ToolRequested, served bool) Envelope {
	token := tr.Call.Tool
	if !served {
		token = UnknownToolToken
	}
	return Envelope{SubjectToolRequested(tr.RunID, token), Meta{
		ID: IDToolRequested(tr.RunID, tr.Step, tr.Call.CallID, tr.Approved), Type: TypeToolRequested, Source: source,
		RunID: tr.RunID, Step: tr.Step, CallID: tr.Call.CallID, CallIndex: tr.CallIndex, CallCount: tr.CallCount, HasCall: true,
	}, tr}
}

// ToolFinishedEvent is the tool.finished event of one call: its one result.
func ToolFinishedEvent(source string, tf toolbus.ToolFinished) Envelope {
	return Envelope{SubjectToolFinished(tf.RunID, tf.Tool), Meta{
		ID: IDToolFinished(tf.RunID, tf.Step, tf.CallID), Type: TypeToolFinished, Source: source,
		RunID: tf.RunID, Step: tf.Step, CallID: tf.CallID, CallIndex: tf.CallIndex, CallCount: tf.CallCount, HasCall: true,
	}, tf}
}

// ToolFinishedEventOn is the tool.finished event of a call taken from the queue of
// token queue: UnknownToolToken puts the result on toolbus.<run>.tool.finished._unknown
// (whoever answers the unknown-tool queue may publish only there, not on the subject of
// a tool another team owns); any other token is ToolFinishedEvent.
func ToolFinishedEventOn(source string, tf toolbus.ToolFinished, queue string) Envelope {
	e := ToolFinishedEvent(source, tf)
	if queue == UnknownToolToken {
		e.Subject = SubjectToolFinished(tf.RunID, UnknownToolToken)
	}
	return e
}

// ToolWaitingEvent is the tool.waiting event of a call that waits for approval.
func ToolWaitingEvent(source string, tw toolbus.ToolWaiting) Envelope {
	return Envelope{SubjectToolWaiting(tw.RunID, tw.Call.Tool), Meta{
		ID: IDToolWaiting(tw.RunID, tw.Step, tw.Call.CallID), Type: TypeToolWaiting, Source: source,
		RunID: tw.RunID, Step: tw.Step, CallID: tw.Call.CallID, CallIndex: tw.CallIndex, CallCount: tw.CallCount, HasCall: true,
	}, tw}
}

// ToolProgressEvent is a tool.progress event of a running call.
func ToolProgressEvent(source string, tp toolbus.ToolProgress) Envelope {
	return Envelope{SubjectToolProgress(tp.RunID, tp.Tool), Meta{
		ID: IDToolProgress(tp.RunID, tp.Step, tp.CallID, tp.Attempt, tp.Seq), Type: TypeToolProgress, Source: source,
		RunID: tp.RunID, Step: tp.Step, CallID: tp.CallID, HasCall: true,
	}, tp}
}

// ToolLogEvent is a tool.log event of a running call.
func ToolLogEvent(source string, tl toolbus.ToolLog) Envelope {
	return Envelope{SubjectToolLog(tl.RunID, tl.Tool), Meta{
		ID: IDToolLog(tl.RunID, tl.Step, tl.CallID, tl.Attempt, tl.Seq), Type: TypeToolLog, Source: source,
		RunID: tl.RunID, Step: tl.Step, CallID: tl.CallID, HasCall: true,
	}, tl}
}

// ToolQuestionEvent is a tool.question event of a running call.
func ToolQuestionEvent(source string, q toolbus.ToolQuestion) Envelope {
	return Envelope{SubjectToolQuestion(q.RunID, q.Tool), Meta{
		ID: IDToolQuestion(q.RunID, q.Step, q.CallID, q.Attempt, q.Seq), Type: TypeToolQuestion, Source: source,
		RunID: q.RunID, Step: q.Step, CallID: q.CallID, HasCall: true,
	}, q}
}

// ToolAnswerEvent is the tool.answer event of an answer to a question.
func ToolAnswerEvent(source string, a toolbus.ToolAnswer) Envelope {
	return Envelope{SubjectToolAnswer(a.RunID, a.Who), Meta{
		ID: IDToolAnswer(a.RunID, a.Step, a.CallID, a.Attempt, a.Seq), Type: TypeToolAnswer, Source: source,
		RunID: a.RunID, Step: a.Step, CallID: a.CallID, HasCall: true,
	}, a}
}

// ApprovalEvent is the approval.granted or approval.denied event of a decision on a call
// of step (the step is not in the data: call ids are unique within a step only).
func ApprovalEvent(source string, step int, a toolbus.Approval, granted bool) Envelope {
	typ := TypeApprovalDenied
	if granted {
		typ = TypeApprovalGranted
	}
	id := IDApproval(a.RunID, strconv.Itoa(step)+"/"+a.CallID, granted)
	if granted && a.Arguments != "" {
		// An edit's id names its arguments: an edit refused as invalid does not keep a
		// corrected one out of the stream's duplicate window.
		sum := sha256.Sum256([]byte(a.Arguments))
		id += "/edit/" + hex.EncodeToString(sum[:6])
	}
	return Envelope{SubjectApproval(a.RunID, granted, a.Who), Meta{
		ID: id, Type: typ, Source: source,
		RunID: a.RunID, Step: step, CallID: a.CallID, HasCall: true,
	}, a}
}

// CancelEvent is the run.cancel event of a run.
func CancelEvent(source string, c toolbus.Cancel) Envelope {
	return Envelope{SubjectRunCancel(c.RunID, c.Who),
		Meta{ID: IDRunCancel(c.RunID), Type: TypeRunCancel, Source: source, RunID: c.RunID}, c}
}

// RunEndedEvent is the run.<status> outcome event of a run that ended (or waits) at
// step. A run waits once per remaining set of pending calls, so the id of a
// waiting_for_approval outcome ends in the number of pending calls.
func RunEndedEvent(source string, step int, ended toolbus.RunEnded) Envelope {
	id := IDRunEnded(ended.RunID, step, ended.Status)
	if ended.Status == toolbus.RunWaitingForApproval {
		id += "/" + PendingSet(ended.Pending)
	}
	return Envelope{SubjectRunEnded(ended.RunID, ended.Status),
		Meta{ID: id, Type: TypeRunEnded(ended.Status), Source: source, RunID: ended.RunID, Step: step}, ended}
}

// PendingSet names a set of pending calls in the id of run.waiting_for_approval
// (<run>/<step>/run.waiting_for_approval/<set>): their number, a dash and the FNV-1a
// hash (8 hex digits) of their call ids in call order, each followed by a zero byte. A
// run waits once per set: the same set announced again (when the first call waits, then
// when the step settles) is one event, while another set of the same size (one call
// decided, another waiting since) is a new one.
func PendingSet(calls []toolbus.ToolCall) string {
	h := fnv.New32a()
	for _, c := range calls {
		_, _ = h.Write([]byte(c.CallID))
		_, _ = h.Write([]byte{0})
	}
	return strconv.Itoa(len(calls)) + "-" + fmt.Sprintf("%08x", h.Sum32())
}

// TimerEvent is the deadline timer of a run.
func TimerEvent(source string, t RunTimer) Envelope {
	return Envelope{SubjectTimer(t.RunID), Meta{ID: IDTimer(t.RunID), Type: TypeRunTimer, Source: source, RunID: t.RunID}, t}
}

// PublishEvent publishes e and waits for the stream's acknowledgement; the span of ctx
// parents the consumer's. A duplicate (the same event inside the duplicate window) is
// acknowledged and not stored again; another message that took e's id does not
// suppress it.
func (b *Bus) PublishEvent(ctx context.Context, e Envelope) (*jetstream.PubAck, error) {
	return b.Publish(ctx, e.Subject, e.Meta, e.Data)
}

// PublishEventAsync publishes e without waiting; AwaitAcks (or the future's Wait) waits
// for the stream's acknowledgement and checks a duplicate one as PublishEvent does. The
// span of ctx parents the consumer's.
func (b *Bus) PublishEventAsync(ctx context.Context, e Envelope) (*PubFuture, error) {
	msg, err := b.encode(ctx, e.Subject, e.Meta, e.Data)
	if err != nil {
		return nil, err
	}
	f, err := b.js.PublishMsgAsync(msg, jetstream.WithMsgID(b.msgID(e.Meta.ID)))
	if err != nil {
		return nil, fmt.Errorf("events: publish %s: %w", e.Meta.ID, err)
	}
	return &PubFuture{bus: b, f: f, id: e.Meta.ID}, nil
}
