package trail

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// Failure is the first event of a trail that does not verify, and why.
type Failure struct {
	// Index is the event's position in the trail (0-based), Seq its stream sequence,
	// ID its CloudEvents id ("" when it does not decode).
	Index int
	Seq   uint64
	ID    string
	// Check is the check that failed: decode, signature, signer, key, chain, complete or
	// checkpoint.
	Check  string
	Reason string
}

func (f *Failure) Error() string {
	return fmt.Sprintf("event %d (stream seq %d, id %s): %s: %s", f.Index+1, f.Seq, f.ID, f.Check, f.Reason)
}

// ErrUnsignedRun is wrapped by the result of a trail none of whose events is signed: a
// run from before signing (or from a deployment that signs nothing), never valid.
var ErrUnsignedRun = errors.New("unsigned")

// Result is what Verify found of a trail that verifies.
type Result struct {
	Events  int
	Signers []string // the signers, sorted
	// Checkpoint is the size of the signed checkpoint every event is included in.
	Checkpoint int64
	// Foreign are the events no reader counts (foreign.go), reported, not judged.
	Foreign []Ignored
}

// event is one decoded event of a trail.
type event struct {
	rec     Record
	h       nats.Header
	meta    events.Meta
	data    any
	digest  string
	key     seal.Key
	foreign bool  // no reader counts it (foreign.go)
	bad     error // why it does not decode
}

// Verify checks a trail: every event decodes and agrees with its subject, is signed
// with a key of the bundle valid at its time by a signer allowed to publish it, names
// an earlier event of the run as the one it follows (run.started, decisions, cancels
// and answers start chains of their own), and every call of a step the run went on
// from has its result, and every event is a leaf of the bundle's signed checkpoint
// (audit/checkpoint). An event no reader counts (a tenant's write with no standing in
// the run, foreign.go) is reported in Result.Foreign, not judged. It returns the first
// failure (*Failure), or ErrUnsignedRun for a run none of whose events is signed.
func Verify(b Bundle) (Result, error) {
	evs := make([]*event, 0, len(b.Events))
	at := map[string]int{}
	for i, r := range b.Events {
		e := decode(r)
		if _, dup := at[e.digest]; !dup {
			at[e.digest] = i
		}
		evs = append(evs, e)
	}
	if unsignedRun(evs) {
		return Result{}, fmt.Errorf("%w before %s: no event of run %s is signed (a run from before signed events, or a process without TOOLBUS_SIGNING_KEY); it cannot be verified",
			ErrUnsignedRun, firstKey(b.Keys), b.Run)
	}
	signers := map[string]bool{}
	st := standingOf(evs)
	var foreign []Ignored
	for i, e := range evs {
		fail := func(check, format string, args ...any) error {
			return &Failure{Index: i, Seq: e.rec.Seq, ID: e.meta.ID, Check: check, Reason: fmt.Sprintf(format, args...)}
		}
		if why := st.foreign(e, i, evs, b.Keys); why != "" {
			if e.bad != nil {
				why += fmt.Sprintf(" (it does not decode either: %v)", e.bad)
			}
			e.foreign = true
			foreign = append(foreign, Ignored{Index: i, Seq: e.rec.Seq, ID: e.meta.ID, Reason: why})
			continue
		}
		if e.bad != nil {
			return Result{}, fail("decode", "%s", e.bad)
		}
		if e.meta.RunID != b.Run {
			return Result{}, fail("decode", "the event is of run %s, not %s", e.meta.RunID, b.Run)
		}
		if check, why := signature(e, b.Keys); why != "" {
			return Result{}, fail(check, "%s", why)
		}
		if why := allowed(e); why != "" {
			return Result{}, fail("signer", "%s", why)
		}
		if why := chained(e, i, evs, at); why != "" {
			return Result{}, fail("chain", "%s", why)
		}
		signers[e.key.Signer] = true
	}
	if err := complete(evs); err != nil {
		return Result{}, err
	}
	size, err := included(b, evs)
	if err != nil {
		return Result{}, err
	}
	return Result{Events: len(evs), Signers: slices.Sorted(maps.Keys(signers)), Checkpoint: size, Foreign: foreign}, nil
}

// ClockSkew is how much earlier than its stored time an event may say it was made
// (the publisher's clock against the server's, and the publish's latency) and still be
// judged at the time it says.
const ClockSkew = 10 * time.Second

// at is the time the event's key and grants are judged at: its ce-time, which its
// signer chose, unless the server stored it more than ClockSkew later, then the stored
// time. So a retired or revoked key cannot sign, after its end, an event dated before
// it, nor a team a tool's event dated inside a grant it no longer holds.
func (e *event) at() time.Time {
	if !e.rec.Stored.IsZero() && e.rec.Stored.Sub(e.meta.Time) > ClockSkew {
		return e.rec.Stored
	}
	return e.meta.Time
}

// decode decodes a record, checks its data against its subject and computes its
// digest; why it does not decode is in bad (judged unless the event is foreign).
func decode(r Record) *event {
	e := &event{rec: r, h: nats.Header(r.Header)}
	e.digest = seal.Digest(e.h, r.Data)
	ev, err := events.DecodeEvent(&nats.Msg{Subject: r.Subject, Header: e.h, Data: r.Data})
	e.meta = ev.Meta
	if err != nil {
		e.bad = err
		return e
	}
	if v := events.DataOf(ev.Type); v != nil {
		if err := ev.Bind(v); err != nil {
			e.bad = err
			return e
		}
		e.data = v
	}
	e.bad = events.CheckSubject(r.Subject, ev.Meta, e.data)
	return e
}

// unsignedRun reports whether no event is signed.
func unsignedRun(evs []*event) bool {
	return !slices.ContainsFunc(evs, func(e *event) bool { return len(e.h[seal.HeaderMaterial]) > 0 })
}

// firstKey is when the first key of the ring was issued ("signing" when none is).
func firstKey(r seal.Keyring) string {
	var first time.Time
	for _, k := range r.Keys {
		if first.IsZero() || k.Created.Before(first) {
			first = k.Created
		}
	}
	if first.IsZero() {
		return "signing (no key published)"
	}
	return first.UTC().Format(time.RFC3339)
}

// signature checks the event's signature, that it signs every extension attribute the
// event carries, and that its key was valid at the event's time; it returns the check
// that failed and why ("" when none).
func signature(e *event, ring seal.Keyring) (string, string) {
	id, err := seal.Verify(e.h, e.rec.Data, ring.KeyFunc())
	if errors.Is(err, seal.ErrUnsigned) {
		return "signature", fmt.Sprintf("unsigned %s (published by %s)", e.meta.Type, e.meta.Source)
	}
	if err != nil {
		return "signature", err.Error()
	}
	signed := strings.Split(e.h.Get(seal.HeaderSigned), ",")
	for k := range e.h {
		if name, ok := strings.CutPrefix(k, "ce-"); ok && name != seal.ExtMaterial && name != seal.ExtSigned &&
			!slices.Contains([]string{"id", "source", "specversion", "type", "subject", "time", "dataschema"}, name) &&
			!slices.Contains(signed, name) {
			return "signature", fmt.Sprintf("the extension attribute %s is not signed", name)
		}
	}
	e.key, _ = ring.Lookup(id)
	if why := e.key.ValidAt(e.at()); why != "" {
		return "key", why
	}
	return "", ""
}

// coreTypes are the events only the planner and the injector publish.
var coreTypes = []string{events.TypeModelRequested, events.TypeModelResponded, events.TypeToolRequested, events.TypeRunTimer}

// allowed says why the event's signer may not publish it ("" when it may): a tool's
// events by the team granted the tool at the time (the core-wide executor any tool's; a
// result the planner or the injector gave in an executor's place: rejected, timed out);
// a start, decision, cancel or answer by a client bound to its identity; the core's
// events by the planner or the injector.
func allowed(e *event) string {
	k, t := e.key, e.at()
	kind := k.Kind()
	core := isCore(k)
	typ := e.meta.Type
	last := toolOf(e)
	switch {
	case slices.Contains(coreTypes, typ) || events.IsRunEndedType(typ):
		if core {
			return ""
		}
		return fmt.Sprintf("%s is the planner's or the injector's to publish, not %s's", typ, k.Signer)
	case isClientType(typ):
		if (kind == seal.KindClient || kind == seal.KindRole) && (seal.Granted(k.Identities, last, t) || seal.Granted(k.Identities, "*", t)) {
			return ""
		}
		return fmt.Sprintf("%s names identity %s, which %s was not bound to at %s", typ, last, k.Signer, t.UTC().Format(time.RFC3339))
	case strings.HasPrefix(typ, "toolbus.tool."):
		if (kind == seal.KindTeam || kind == seal.KindRole) && (seal.Granted(k.Tools, last, t) || seal.Granted(k.Tools, "*", t)) {
			return ""
		}
		if tf, ok := e.data.(*toolbus.ToolFinished); ok && core && (tf.Status == toolbus.StatusRejected || tf.Status == toolbus.StatusTimedOut) {
			return ""
		}
		return fmt.Sprintf("%s of tool %s signed by %s, which did not own the tool at %s", typ, last, k.Signer, t.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("%s is no event type of the contract", typ)
}

// isCore reports whether k is the planner's or the injector's key.
func isCore(k seal.Key) bool {
	return k.Kind() == seal.KindRole && (k.Name() == "planner" || k.Name() == "injector")
}

// toolOf is the last token of the event's subject: a tool event's tool, a client
// event's identity.
func toolOf(e *event) string { return e.rec.Subject[strings.LastIndexByte(e.rec.Subject, '.')+1:] }

// isClientType reports a type a client publishes: a start, a decision, a cancel, an answer.
func isClientType(typ string) bool {
	return typ == events.TypeRunStarted || typ == events.TypeApprovalGranted || typ == events.TypeApprovalDenied ||
		typ == events.TypeRunCancel || typ == events.TypeToolAnswer
}

// chained says why the event breaks the run's chain ("" when it does not): an event a
// worker published names the event it handled, which must be an earlier event of the
// run; a tool's event names its call's tool.requested, a model.responded its step's
// model.requested.
func chained(e *event, i int, evs []*event, at map[string]int) string {
	prev := e.h.Get(seal.HeaderPrevDigest)
	if prev == "" {
		if isClientType(e.meta.Type) {
			return ""
		}
		return fmt.Sprintf("%s names no previous event", e.meta.Type)
	}
	j, ok := at[prev]
	switch {
	case !ok:
		return fmt.Sprintf("it follows event %s, which the run does not hold (removed or altered)", prev)
	case j >= i:
		return fmt.Sprintf("it follows event %d (%s), stored after it (reordered)", j+1, evs[j].meta.ID)
	}
	p := evs[j]
	if p.foreign {
		return fmt.Sprintf("it follows event %d (%s), which no reader counts (foreign): an event it needs removed or altered", j+1, p.meta.ID)
	}
	switch e.meta.Type {
	case events.TypeToolFinished, events.TypeToolWaiting, events.TypeToolProgress, events.TypeToolLog, events.TypeToolQuestion:
		if p.meta.Type == events.TypeToolRequested && (p.meta.CallID != e.meta.CallID || p.meta.Step != e.meta.Step || !isCore(e.key) && toolOf(p) != toolOf(e)) {
			return fmt.Sprintf("it follows %s, another call's request", p.meta.ID)
		}
		// A tool's event is of a call the core requested of that tool before it: a team
		// may sign its own tool's events only, and they count for its own calls only.
		if !isCore(e.key) && !slices.ContainsFunc(evs[:i], func(r *event) bool {
			return r.meta.Type == events.TypeToolRequested && r.meta.CallID == e.meta.CallID && r.meta.Step == e.meta.Step && toolOf(r) == toolOf(e)
		}) {
			return fmt.Sprintf("call %s of step %d was never requested of tool %s before it", e.meta.CallID, e.meta.Step, toolOf(e))
		}
	case events.TypeModelResponded:
		if p.meta.Type != events.TypeModelRequested || p.meta.Step != e.meta.Step {
			return fmt.Sprintf("it follows %s, not its step's model.requested", p.meta.ID)
		}
	}
	return ""
}

// complete checks that every call of a step the run went on from (a later step was
// requested, or the run ended) was requested (foreign.go) and has a result
// (tool.finished, or tool.waiting).
func complete(evs []*event) error {
	type call struct {
		step     int
		id, tool string // tool "": a result the core gave, which answers the call whatever its subject
	}
	answered := map[call]bool{}
	lastStep, ended := -1, -1
	for i, e := range evs {
		switch {
		case e.foreign:
		case e.meta.Type == events.TypeToolFinished || e.meta.Type == events.TypeToolWaiting:
			tool := toolOf(e)
			if isCore(e.key) {
				tool = ""
			}
			answered[call{e.meta.Step, e.meta.CallID, tool}] = true
		case e.meta.Type == events.TypeModelRequested:
			lastStep = max(lastStep, e.meta.Step)
		case events.IsRunEndedType(e.meta.Type):
			ended = i
		}
	}
	went := func(step int) bool { return step < lastStep || ended >= 0 }
	if err := requested(evs, went); err != nil {
		return err
	}
	for i, e := range evs {
		c := call{e.meta.Step, e.meta.CallID, toolOf(e)}
		if e.foreign || e.meta.Type != events.TypeToolRequested || answered[c] || answered[call{c.step, c.id, ""}] || !went(e.meta.Step) {
			continue
		}
		return &Failure{Index: i, Seq: e.rec.Seq, ID: e.meta.ID, Check: "complete",
			Reason: fmt.Sprintf("call %s of step %d has no result, yet the run went on (a result removed)", c.id, c.step)}
	}
	return nil
}

// Explain writes the outcome of Verify for a person and returns the exit code of a
// command that verified: 0 verified, 1 a failure (the first event that fails and why),
// 3 a run none of whose events is signed (never valid).
func Explain(w io.Writer, run string, res Result, err error) int {
	var f *Failure
	switch {
	case err == nil:
		fmt.Fprintf(w, "run %s verified: %d events, each signed by a signer allowed to publish it, chained, no result missing, included in the signed checkpoint of %d messages (signers: %s)\n",
			run, res.Events-len(res.Foreign), res.Checkpoint, strings.Join(res.Signers, ", "))
		for _, f := range res.Foreign {
			fmt.Fprintf(w, "  event %d (stream seq %d, id %s): foreign: ignored: %s\n", f.Index+1, f.Seq, f.ID, f.Reason)
		}
		return 0
	case errors.As(err, &f):
		fmt.Fprintf(w, "run %s does NOT verify: %v\n", run, f)
		return 1
	case errors.Is(err, ErrUnsignedRun):
		fmt.Fprintf(w, "run %s is %v\n", run, err)
		return 3
	}
	fmt.Fprintf(w, "run %s does NOT verify: %v\n", run, err)
	return 1
}

// VerifyFile is `toolbus audit verify FILE`: the bundle verified with no bus, explained
// on w; it returns the exit code (Explain).
func VerifyFile(file string, w io.Writer) int {
	b, err := ReadFile(file)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	res, err := Verify(b)
	return Explain(w, b.Run, res, err)
}
