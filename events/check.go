package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
)

// Subject and body agree.
//
// A subject permission says who may publish where: toolbus.<run>.approval.granted is a
// client's, toolbus.<run>.tool.finished.<tool> an executor's. That is worth something
// only if the event means what its subject says. A consumer that took the run from the
// body (or from the ce-runid extension) and the permission from the subject could be
// told to act on another run: an approval published under toolbus.decoy.approval.granted
// naming another run's call. So every consumer checks, before it acts, that the subject
// names the event's run, type and tool (CheckSubject), and terminates an event that
// disagrees, with the reason; readers (replay, audit, the console) report it as a
// violation and never count it for either run.

// ErrPoison is wrapped by handler errors for a message that can never be processed (not
// a CloudEvent, undecodable data, an unknown event type). The consume loop terminates
// such messages with the reason instead of redelivering them; JetStream then emits the
// advisory $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>, which
// operators watch.
var ErrPoison = errors.New("events: poison message")

// ErrSubjectMismatch is wrapped by the error of an event whose subject and body (or
// attributes) disagree. The error also wraps ErrPoison: consumers terminate the event.
var ErrSubjectMismatch = errors.New("events: subject and body disagree")

// MismatchError is an event whose subject and body disagree.
type MismatchError struct {
	Subject string
	Type    string
	// Reason says what disagrees.
	Reason string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%v: %s on %s: %s", ErrSubjectMismatch, e.Type, e.Subject, e.Reason)
}

// Unwrap returns ErrSubjectMismatch and ErrPoison.
func (e *MismatchError) Unwrap() []error { return []error{ErrSubjectMismatch, ErrPoison} }

// CheckSubject reports (as a *MismatchError) whether the subject of an event disagrees
// with its type, attributes or data: the subject must be toolbus.<run>.<type>, with the
// tool token of the call for tool events (SubjectToolRequested and its siblings; a
// tool.requested may also be on UnknownToolToken: the record of a call nobody serves,
// which the planner answers), and the identity token (IdentityToken) of the principal
// or actor for run.started, approvals and cancels; <run> must be the data's run_id and
// the runid extension when present, the callid extension when present must be the
// data's call id, and a run outcome's status must be its type's. data is the decoded
// data of the event, a contract type or a pointer to one; other values are checked
// for the run id of the subject and the extension only.
func CheckSubject(subject string, m Meta, data any) error {
	bad := func(format string, args ...any) error {
		return &MismatchError{Subject: subject, Type: m.Type, Reason: fmt.Sprintf(format, args...)}
	}
	run, rest, ok := splitSubject(subject)
	if !ok {
		return bad("not a toolbus subject")
	}
	if m.RunID != "" && m.RunID != run {
		return bad("the runid attribute names run %q", m.RunID)
	}
	base := strings.TrimPrefix(m.Type, SubjectPrefix+".")
	var (
		bodyRun string
		callID  string
		tools   []string // the tool tokens the subject may end in
		who     *string  // the identity the subject must end in (IdentityToken)
	)
	switch d := deref(data).(type) {
	case toolbus.RunStarted:
		bodyRun, who = d.RunID, &d.Principal.ID
	case toolbus.ModelRequested:
		bodyRun = d.RunID
	case toolbus.ModelResponded:
		bodyRun = d.RunID
	case toolbus.ToolRequested:
		bodyRun, callID, tools = d.RunID, d.Call.CallID, []string{ToolToken(d.Call.Tool), UnknownToolToken}
	case toolbus.ToolFinished:
		// A result is on its tool's subject, which only the tool's owners (and the
		// planner and injector) may publish: no result subject is shared between teams.
		bodyRun, callID, tools = d.RunID, d.CallID, []string{ToolToken(d.Tool)}
	case toolbus.ToolWaiting:
		bodyRun, callID, tools = d.RunID, d.Call.CallID, []string{ToolToken(d.Call.Tool)}
	case toolbus.ToolProgress:
		bodyRun, callID, tools = d.RunID, d.CallID, []string{ToolToken(d.Tool)}
	case toolbus.ToolLog:
		bodyRun, callID, tools = d.RunID, d.CallID, []string{ToolToken(d.Tool)}
	case toolbus.ToolQuestion:
		bodyRun, callID, tools = d.RunID, d.CallID, []string{ToolToken(d.Tool)}
	case toolbus.ToolAnswer:
		bodyRun, callID, who = d.RunID, d.CallID, &d.Who
	case toolbus.Approval:
		bodyRun, callID, who = d.RunID, d.CallID, &d.Who
	case toolbus.Cancel:
		bodyRun, who = d.RunID, &d.Who
	case toolbus.RunEnded:
		bodyRun = d.RunID
		if "run."+string(d.Status) != base {
			return bad("the data says status %q", d.Status)
		}
	case RunTimer:
		bodyRun = d.RunID
	default:
		return nil
	}
	if bodyRun != run {
		return bad("the data names run %q", bodyRun)
	}
	if m.CallID != "" && callID != "" && m.CallID != callID {
		return bad("the callid attribute %q is not the data's call %q", m.CallID, callID)
	}
	if who != nil {
		// The identity token is what the publisher's credentials allowed (a client bound
		// to one principal may publish only ...run.started.<principal>): the body must
		// name that very identity, or it would claim someone else's.
		token, ok := strings.CutPrefix(rest, base+".")
		if !ok || strings.Contains(token, ".") {
			return bad("a %s event belongs on %s", m.Type, SubjectPrefix+"."+run+"."+base+"."+IdentityToken(*who))
		}
		if IdentityToken(*who) != token {
			return bad("the subject names %q, the data %q", token, *who)
		}
		return nil
	}
	if tools == nil {
		if rest != base {
			return bad("a %s event belongs on %s", m.Type, SubjectPrefix+"."+run+"."+base)
		}
		return nil
	}
	for _, tool := range tools {
		if rest == base+"."+tool {
			return nil
		}
	}
	return bad("a %s event of tool %q belongs on %s", m.Type, tools[0], SubjectPrefix+"."+run+"."+base+"."+tools[0])
}

// splitSubject splits toolbus.<run>.<rest>.
func splitSubject(subject string) (run, rest string, ok bool) {
	after, ok := strings.CutPrefix(subject, SubjectPrefix+".")
	if !ok {
		return "", "", false
	}
	run, rest, ok = strings.Cut(after, ".")
	return run, rest, ok && run != "" && rest != ""
}

// deref returns *v for a pointer to a contract type, else v.
func deref(v any) any {
	switch p := v.(type) {
	case *toolbus.RunStarted:
		return *p
	case *toolbus.ModelRequested:
		return *p
	case *toolbus.ModelResponded:
		return *p
	case *toolbus.ToolRequested:
		return *p
	case *toolbus.ToolFinished:
		return *p
	case *toolbus.ToolWaiting:
		return *p
	case *toolbus.ToolProgress:
		return *p
	case *toolbus.ToolLog:
		return *p
	case *toolbus.ToolQuestion:
		return *p
	case *toolbus.ToolAnswer:
		return *p
	case *toolbus.Approval:
		return *p
	case *toolbus.Cancel:
		return *p
	case *toolbus.RunEnded:
		return *p
	case *RunTimer:
		return *p
	}
	return v
}

// DataOf returns a new value (a pointer) of the contract type of events of type typ,
// or nil for a type the contract does not define.
func DataOf(typ string) any {
	switch typ {
	case TypeRunStarted:
		return new(toolbus.RunStarted)
	case TypeModelRequested:
		return new(toolbus.ModelRequested)
	case TypeModelResponded:
		return new(toolbus.ModelResponded)
	case TypeToolRequested:
		return new(toolbus.ToolRequested)
	case TypeToolFinished:
		return new(toolbus.ToolFinished)
	case TypeToolWaiting:
		return new(toolbus.ToolWaiting)
	case TypeToolProgress:
		return new(toolbus.ToolProgress)
	case TypeToolLog:
		return new(toolbus.ToolLog)
	case TypeToolQuestion:
		return new(toolbus.ToolQuestion)
	case TypeToolAnswer:
		return new(toolbus.ToolAnswer)
	case TypeApprovalGranted, TypeApprovalDenied:
		return new(toolbus.Approval)
	case TypeRunCancel:
		return new(toolbus.Cancel)
	case TypeRunTimer:
		return new(RunTimer)
	}
	if IsRunEndedType(typ) {
		return new(toolbus.RunEnded)
	}
	return nil
}

// CheckStored is CheckSubject for an event whose data is still JSON; data that does
// not decode is left to the reader's own decoding.
func CheckStored(subject string, m Meta, data json.RawMessage) error {
	v := DataOf(m.Type)
	if v == nil {
		return CheckSubject(subject, m, nil)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return nil
	}
	return CheckSubject(subject, m, v)
}

// CheckMsg decodes a message heard outside a consumer (a core NATS subscription to
// cancellations or outcomes) and returns its run id and type once its subject, type and
// data agree (CheckSubject). Errors wrap ErrNotCloudEvent or ErrSubjectMismatch.
func CheckMsg(msg *nats.Msg) (run string, typ string, err error) {
	ev, err := DecodeEvent(msg)
	if err != nil {
		return "", "", err
	}
	v := DataOf(ev.Type)
	if v == nil {
		return "", ev.Type, &MismatchError{Subject: msg.Subject, Type: ev.Type, Reason: "not a toolbus event type"}
	}
	if err := ev.Bind(v); err != nil {
		return "", ev.Type, err
	}
	if err := CheckSubject(msg.Subject, ev.Meta, v); err != nil {
		return "", ev.Type, err
	}
	run, _, _ = splitSubject(msg.Subject)
	return run, ev.Type, nil
}

// CancelOf returns the run a run.cancel message cancels and who sent it: the run and
// the identity token its subject names (SubjectRunCancel), once its body agrees
// (CheckMsg). A message that is not such a cancel cancels nothing.
func CancelOf(msg *nats.Msg) (run, who string, ok bool) {
	run, typ, err := CheckMsg(msg)
	if err != nil || typ != TypeRunCancel {
		return "", "", false
	}
	return run, msg.Subject[strings.LastIndexByte(msg.Subject, '.')+1:], true
}
