package events

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
)

// SubjectPrefix is the first token of every toolbus subject.
const SubjectPrefix = "toolbus"

// CloudEvents types of the contract.
const (
	TypeRunStarted      = "toolbus.run.started"
	TypeModelRequested  = "toolbus.model.requested"
	TypeModelResponded  = "toolbus.model.responded"
	TypeToolRequested   = "toolbus.tool.requested"
	TypeToolFinished    = "toolbus.tool.finished"
	TypeToolWaiting     = "toolbus.tool.waiting"
	TypeToolProgress    = "toolbus.tool.progress"
	TypeToolLog         = "toolbus.tool.log"
	TypeToolQuestion    = "toolbus.tool.question"
	TypeToolAnswer      = "toolbus.tool.answer"
	TypeApprovalGranted = "toolbus.approval.granted"
	TypeApprovalDenied  = "toolbus.approval.denied"
	TypeRunCancel       = "toolbus.run.cancel"
)

// TypeRunEnded returns the CloudEvents type of a run outcome, e.g. toolbus.run.completed.
func TypeRunEnded(s toolbus.RunStatus) string { return "toolbus.run." + string(s) }

// IsRunEndedType reports whether typ is the type of a run outcome (TypeRunEnded):
// toolbus.run.<status>, not run.started nor run.cancel. The one home of that rule for
// every reader that sorts events by type.
func IsRunEndedType(typ string) bool {
	return strings.HasPrefix(typ, "toolbus.run.") && typ != TypeRunStarted && typ != TypeRunCancel
}

// UnknownToolToken is the subject token used for a call whose tool name is not a valid
// subject token or not in the catalog; every executor deployment listens to it so the
// call still gets exactly one (rejected) result.
const UnknownToolToken = "_unknown"

// Subjects. Every subject carries the run id as its second token, so toolbus.<run>.>
// replays one run in order.

// NoIdentityToken is the identity token of an event that names nobody: a run.started
// with no principal id, an approval or cancel with no who.
const NoIdentityToken = "_none"

// IdentityToken returns the subject token of a principal or actor id: the id itself
// when it is a subject token of [A-Za-z0-9_-] (1 to 128 characters), NoIdentityToken
// for an empty id, and "" for an id that cannot be a token (publishers refuse it).
//
// The identity is a token of the subject (run.started.<principal>,
// approval.<decision>.<actor>, run.cancel.<actor>) so that the server's subject
// permissions can bind it to a credential: a client credential allowed only
// toolbus.*.run.started.alice can start runs for alice and nobody else, and every
// consumer checks that the body names the identity of its subject (CheckSubject).
func IdentityToken(id string) string {
	switch {
	case id == "":
		return NoIdentityToken
	case toolbus.ValidRunID(id):
		return id
	}
	return ""
}

// identityRefused is the error of publishing an event that names an identity (a
// principal, an approver, a canceller: role) which cannot be a subject token; nil when it
// can (IdentityToken).
func identityRefused(role, id string) error {
	if IdentityToken(id) != "" {
		return nil
	}
	return fmt.Errorf("events: invalid %s %q: use %s (it is a subject token)", role, id, toolbus.IDShape)
}

// SubjectRunStarted is toolbus.<run>.run.started.<principal>: the principal's identity
// token (IdentityToken) ends the subject.
func SubjectRunStarted(run, principal string) string {
	return SubjectPrefix + "." + run + ".run.started." + IdentityToken(principal)
}

// SubjectRunStartedAny is toolbus.<run>.run.started.*: the run.started events of a run,
// whoever they name.
func SubjectRunStartedAny(run string) string { return SubjectPrefix + "." + run + ".run.started.*" }

// SubjectModelRequested is toolbus.<run>.model.requested.
func SubjectModelRequested(run string) string { return SubjectPrefix + "." + run + ".model.requested" }

// SubjectModelResponded is toolbus.<run>.model.responded.
func SubjectModelResponded(run string) string { return SubjectPrefix + "." + run + ".model.responded" }

// SubjectToolRequested is toolbus.<run>.tool.requested.<tool>; an invalid tool name is
// replaced by UnknownToolToken.
func SubjectToolRequested(run, tool string) string {
	return SubjectPrefix + "." + run + ".tool.requested." + ToolToken(tool)
}

// SubjectToolFinished is toolbus.<run>.tool.finished.<tool>.
func SubjectToolFinished(run, tool string) string {
	return SubjectPrefix + "." + run + ".tool.finished." + ToolToken(tool)
}

// SubjectToolFinishedAny is toolbus.<run>.tool.finished.>: the results of a run,
// whatever their tool.
func SubjectToolFinishedAny(run string) string {
	return SubjectPrefix + "." + run + ".tool.finished.>"
}

// SubjectToolWaiting is toolbus.<run>.tool.waiting.<tool>.
func SubjectToolWaiting(run, tool string) string {
	return SubjectPrefix + "." + run + ".tool.waiting." + ToolToken(tool)
}

// SubjectToolProgress is toolbus.<run>.tool.progress.<tool>.
func SubjectToolProgress(run, tool string) string {
	return SubjectPrefix + "." + run + ".tool.progress." + ToolToken(tool)
}

// SubjectToolLog is toolbus.<run>.tool.log.<tool>.
func SubjectToolLog(run, tool string) string {
	return SubjectPrefix + "." + run + ".tool.log." + ToolToken(tool)
}

// SubjectToolQuestion is toolbus.<run>.tool.question.<tool>.
func SubjectToolQuestion(run, tool string) string {
	return SubjectPrefix + "." + run + ".tool.question." + ToolToken(tool)
}

// SubjectToolAnswer is toolbus.<run>.tool.answer.<who>: the identity token of who
// answered ends the subject, as an approval's.
func SubjectToolAnswer(run, who string) string {
	return SubjectPrefix + "." + run + ".tool.answer." + IdentityToken(who)
}

// FilterToolAnswers selects the answers of one run.
func FilterToolAnswers(run string) string { return SubjectPrefix + "." + run + ".tool.answer.*" }

// SubjectApproval is toolbus.<run>.approval.granted.<actor> or .denied.<actor>: the
// identity token (IdentityToken) of who decided ends the subject.
func SubjectApproval(run string, granted bool, who string) string {
	if granted {
		return SubjectPrefix + "." + run + ".approval.granted." + IdentityToken(who)
	}
	return SubjectPrefix + "." + run + ".approval.denied." + IdentityToken(who)
}

// SubjectRunCancel is toolbus.<run>.run.cancel.<actor>: the identity token
// (IdentityToken) of who cancels ends the subject.
func SubjectRunCancel(run, who string) string {
	return SubjectPrefix + "." + run + ".run.cancel." + IdentityToken(who)
}

// SubjectRunCancelAny is toolbus.<run>.run.cancel.*: the cancels of a run, whoever sent them.
func SubjectRunCancelAny(run string) string { return SubjectPrefix + "." + run + ".run.cancel.*" }

// SubjectRunEnded is toolbus.<run>.run.<status>.
func SubjectRunEnded(run string, s toolbus.RunStatus) string {
	return SubjectPrefix + "." + run + ".run." + string(s)
}

// SubjectRun is toolbus.<run>.>: every event of one run.
func SubjectRun(run string) string { return SubjectPrefix + "." + run + ".>" }

// IsFinalOutcome reports whether subject is a run's final outcome,
// toolbus.<run>.run.<status> of a terminal status: nothing of the run follows it
// (run.started and run.cancel have a fifth token; waiting_for_approval is not final).
func IsFinalOutcome(subject string) bool {
	toks := strings.Split(subject, ".")
	return len(toks) == 4 && toks[0] == SubjectPrefix && toks[2] == "run" && toolbus.RunStatus(toks[3]).Terminal()
}

// Filter subjects used by the workers' consumers.
const (
	FilterAll            = SubjectPrefix + ".>"
	FilterModelRequested = SubjectPrefix + ".*.model.requested"
	FilterToolRequested  = SubjectPrefix + ".*.tool.requested.>"
	FilterToolFinished   = SubjectPrefix + ".*.tool.finished.>"
	FilterToolWaiting    = SubjectPrefix + ".*.tool.waiting.>"
	FilterToolProgress   = SubjectPrefix + ".*.tool.progress.>"
	FilterToolLog        = SubjectPrefix + ".*.tool.log.>"
	FilterApprovals      = SubjectPrefix + ".*.approval.>"
	FilterRunCancel      = SubjectPrefix + ".*.run.cancel.*"
	FilterRunEnded       = SubjectPrefix + ".*.run.*"
	// FilterRunStarted selects the run.started events of every run.
	FilterRunStarted = SubjectPrefix + ".*.run.started.*"
)

// FilterToolRequestedFor selects the requests of one tool across all runs.
func FilterToolRequestedFor(tool string) string {
	return SubjectPrefix + ".*.tool.requested." + ToolToken(tool)
}

// The tools' queues. A queue that is a consumer of the event stream filtered on
// toolbus.*.tool.requested.<tool> makes the server walk, for each call it delivers,
// every message stored since the queue's last call, matching each subject against the
// wildcard (the run id is in every subject): per call, work that grows with the number
// of tools (docs/performance.md, "Routing CPU at 1,000 tools"). The queue stream
// (QueueStreamName) holds the calls only, each on its tool's one exact subject, which
// the server copies there itself (a source of the event stream with a subject
// transform): nobody may publish on a queue subject, and a queue's filter is exact.

// QueuePrefix is the first token of the queue subjects.
const QueuePrefix = "toolbus_queue"

// SubjectQueue is toolbus_queue.<tool>: the subject of a tool's calls in the queue
// stream, and the filter of its queue (ToolConsumer).
func SubjectQueue(tool string) string { return QueuePrefix + "." + ToolToken(tool) }

// The subject transform of the queue stream's source: the call published on
// toolbus.<run>.tool.requested.<tool> is stored as toolbus_queue.<tool>.
const (
	QueueSourceFilter = SubjectPrefix + ".*.tool.requested.*"
	QueueDestination  = QueuePrefix + ".{{wildcard(2)}}"
)

// QueuePublishedOn is the subject of the event stream the calls of the queue subject
// queue (SubjectQueue) are published on, toolbus.*.tool.requested.<tool>: what an idle
// queue listens to (consume.Doorbell), since nothing is published on the queue's own.
// Other subjects are returned as they are.
func QueuePublishedOn(queue string) string {
	if tool, ok := strings.CutPrefix(queue, QueuePrefix+"."); ok {
		return FilterToolRequestedFor(tool)
	}
	return queue
}

// StreamSourceHeader is the header the server sets on every message it copies from one
// stream to another: "<stream> <sequence> <filter> <transform> <subject>", the last
// field the subject the message was published on.
const StreamSourceHeader = "Nats-Stream-Source"

// CallSubject is the subject a call was published on, toolbus.<run>.tool.requested.<tool>:
// subject itself for a message of the event stream, the original subject in the
// server's StreamSourceHeader for a message of the queue stream ("" if there is none).
// Only the server writes in the queue stream (it has no subject of its own), so the
// header is the server's; with fair share the core's scheduler also writes there, and
// its releases name the call's subject in FairCallSubjectHeader (the server refuses a
// published Nats-Stream-Source).
func CallSubject(subject string, hdr nats.Header) string {
	if !strings.HasPrefix(subject, QueuePrefix+".") {
		return subject
	}
	vals := hdr.Values(StreamSourceHeader)
	if len(vals) == 0 {
		return hdr.Get(FairCallSubjectHeader)
	}
	f := strings.Fields(vals[len(vals)-1])
	if len(f) < 5 {
		return ""
	}
	return f[4]
}

// ToolToken returns tool if it is a valid tool name, else UnknownToolToken.
func ToolToken(tool string) string {
	if toolbus.ValidToolName(tool) {
		return tool
	}
	return UnknownToolToken
}

// ToolTokenOfSubject returns the last token of a tool.requested, tool.finished or
// tool.waiting subject: the tool's token (or UnknownToolToken).
func ToolTokenOfSubject(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// RunIDFromSubject returns the run id token of a toolbus subject.
func RunIDFromSubject(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, SubjectPrefix+".")
	if !ok {
		return "", false
	}
	run, _, ok := strings.Cut(rest, ".")
	return run, ok && run != ""
}

// Deterministic event ids, also sent as Nats-Msg-Id so a republished event is dropped
// by the stream's duplicate window.

// IDRunStarted is <run>/run.started.
func IDRunStarted(run string) string { return run + "/run.started" }

// IDModelRequested is <run>/<step>/model.requested.
func IDModelRequested(run string, step int) string {
	return run + "/" + strconv.Itoa(step) + "/model.requested"
}

// IDModelResponded is <run>/<step>/model.responded.
func IDModelResponded(run string, step int) string {
	return run + "/" + strconv.Itoa(step) + "/model.responded"
}

// IDToolRequested is <run>/<step>/<call_id>/tool.requested, with a suffix for a call
// re-issued after an approval decision.
func IDToolRequested(run string, step int, callID string, approved bool) string {
	id := run + "/" + strconv.Itoa(step) + "/" + callID + "/tool.requested"
	if approved {
		id += "/decided"
	}
	return id
}

// IDToolFinished is <run>/<step>/<call_id>/tool.finished.
func IDToolFinished(run string, step int, callID string) string {
	return run + "/" + strconv.Itoa(step) + "/" + callID + "/tool.finished"
}

// IDToolWaiting is <run>/<step>/<call_id>/tool.waiting.
func IDToolWaiting(run string, step int, callID string) string {
	return run + "/" + strconv.Itoa(step) + "/" + callID + "/tool.waiting"
}

// IDToolProgress is <run>/<step>/<call_id>/tool.progress/<attempt>/<seq>.
func IDToolProgress(run string, step int, callID string, attempt, seq int) string {
	return run + "/" + strconv.Itoa(step) + "/" + callID + "/tool.progress/" + strconv.Itoa(attempt) + "/" + strconv.Itoa(seq)
}

// IDToolLog is <run>/<step>/<call_id>/tool.log/<attempt>/<seq>.
func IDToolLog(run string, step int, callID string, attempt, seq int) string {
	return run + "/" + strconv.Itoa(step) + "/" + callID + "/tool.log/" + strconv.Itoa(attempt) + "/" + strconv.Itoa(seq)
}

// IDToolQuestion is <run>/<step>/<call_id>/tool.question/<attempt>/<seq>.
func IDToolQuestion(run string, step int, callID string, attempt, seq int) string {
	return run + "/" + strconv.Itoa(step) + "/" + callID + "/tool.question/" + strconv.Itoa(attempt) + "/" + strconv.Itoa(seq)
}

// IDToolAnswer is <run>/<step>/<call_id>/tool.answer/<attempt>/<seq>: the first answer
// to a question stands.
func IDToolAnswer(run string, step int, callID string, attempt, seq int) string {
	return run + "/" + strconv.Itoa(step) + "/" + callID + "/tool.answer/" + strconv.Itoa(attempt) + "/" + strconv.Itoa(seq)
}

// IDRunEnded is <run>/<step>/run.<status>.
func IDRunEnded(run string, step int, s toolbus.RunStatus) string {
	return run + "/" + strconv.Itoa(step) + "/run." + string(s)
}

// IDApproval is <run>/<call_id>/approval.<granted|denied>.
func IDApproval(run, callID string, granted bool) string {
	if granted {
		return run + "/" + callID + "/approval.granted"
	}
	return run + "/" + callID + "/approval.denied"
}

// IDRunCancel is <run>/run.cancel.
func IDRunCancel(run string) string { return run + "/run.cancel" }

// NoticePrefix roots the notices the core account sends to executors in team accounts
// (core NATS, outside the event stream's subjects: nothing is stored). A team imports
// the notices of its own tools only.
const NoticePrefix = "toolbus_notice"

// SubjectRunEndedFor is the notice that run ended (any outcome but completed) while a
// call of tool may still run: toolbus_notice.<run>.ended.<tool>. Its body is the run's
// outcome (RunEndedNotice). An executor in a team account, which hears no run.cancel
// and no outcome, cancels its calls of the run on it.
func SubjectRunEndedFor(run, tool string) string {
	return NoticePrefix + "." + run + ".ended." + ToolToken(tool)
}

// FilterRunEndedFor is every SubjectRunEndedFor notice of tool.
func FilterRunEndedFor(tool string) string { return NoticePrefix + ".*.ended." + ToolToken(tool) }

// RunEndedNotice is the body of a SubjectRunEndedFor notice.
type RunEndedNotice struct {
	RunID  string            `json:"run_id"`
	Status toolbus.RunStatus `json:"status"`
}
