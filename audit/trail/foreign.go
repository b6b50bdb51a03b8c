package trail

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// Ignored is an event of the run no reader counts (the injector, the executors, the
// console, replay): a tenant's write with no standing in the run, which the write service
// stores on any run id. Verify reports it and judges the run without it, so that another
// tenant's stray write cannot make a run fail, while every event that counts is checked.
type Ignored struct {
	Index  int
	Seq    uint64
	ID     string
	Reason string
}

// standing is what the core wrote of the run, which decides who has standing in it: the
// run's start and the events the core's own events name as the one they handled.
type standing struct {
	start *toolbus.RunStarted
	named map[string]bool // digests a core type's event names as its parent
}

// standingOf reads the run's standing: the start is the run.started a core event names
// (model.requested of step 0), else the first one stored.
func standingOf(evs []*event) standing {
	s := standing{named: map[string]bool{}}
	for _, e := range evs {
		if typ := typeOf(e); slices.Contains(coreTypes, typ) || events.IsRunEndedType(typ) {
			if p := e.h.Get(seal.HeaderPrevDigest); p != "" {
				s.named[p] = true
			}
		}
	}
	for _, e := range evs {
		rs, ok := e.data.(*toolbus.RunStarted)
		if ok && typeOf(e) == events.TypeRunStarted && (s.start == nil || s.named[e.digest]) {
			s.start = rs
		}
	}
	return s
}

// foreign says why no reader counts the event ("" when one does), from what the core
// wrote only: a start, decision, cancel or answer counts when a core event names it as
// the one it handled, or when its identity has standing in the run (the start: the first
// one; an answer: the run's principal; a decision or cancel: the principal or an approver
// its start lists); a tool's event counts when the core requested its call of that tool
// before it (its tool.requested, or the step's model.responded listing the call: so a
// removed request still leaves its results judged, and failing the chain), or when the planner or the injector signed it (a result in the executor's
// place). An event that is foreign by these rules is one the administrator could only
// have made so by altering or removing an event that counts, which the chain (an event
// that counts may not follow a foreign one), the results each call needs and the
// checkpoint still catch.
//
// Its kind is its subject's (typeOf), never the type it carries: a tenant chooses its
// headers, the write service checked its subject. A tenant's event on its own subject
// with no CloudEvents headers, or typed as the core's, is judged as what its subject is.
func (s standing) foreign(e *event, i int, evs []*event, ring seal.Keyring) string {
	typ, who := typeOf(e), toolOf(e)
	switch {
	case isClientType(typ):
		if s.named[e.digest] {
			return ""
		}
		switch {
		case s.start == nil:
			return fmt.Sprintf("%s by %s in a run with no start", typ, who)
		case typ == events.TypeRunStarted:
			if e.data == s.start {
				return ""
			}
			return fmt.Sprintf("%s by %s after the run's start (principal %s)", typ, who, s.start.Principal.ID)
		case typ == events.TypeToolAnswer && who == s.start.Principal.ID,
			typ != events.TypeToolAnswer && s.start.NamesDecider(who):
			return ""
		}
		return fmt.Sprintf("%s by %s, neither the run's principal (%s) nor named by the core as handled", typ, who, s.start.Principal.ID)
	case slices.Contains(coreTypes, typ) || events.IsRunEndedType(typ) || !strings.HasPrefix(typ, toolTypes):
		return "" // a subject only the core writes: judged
	}
	if slices.ContainsFunc(evs[:i], func(r *event) bool { return requests(r, e.meta.Step, e.meta.CallID, who) }) {
		return ""
	}
	// The core's result in the executor's place, on this very subject: a signed event of
	// the core's copied whole (a team sees its calls, signed) onto the team's subject of
	// another run disagrees with it (e.bad) and counts for nothing.
	probe := *e
	if check, _ := signature(&probe, ring); check == "" && isCore(probe.key) && e.bad == nil {
		return ""
	}
	return fmt.Sprintf("%s of tool %s for call %s of step %d, which the core never requested of that tool", typ, who, e.meta.CallID, e.meta.Step)
}

// toolTypes prefixes the types of a tool's events.
const toolTypes = events.SubjectPrefix + ".tool."

// typeOf is the type an event's subject stands for (toolbus.<run>.<a>.<b>[.<last>] is
// toolbus.<a>.<b>; "" for another subject).
func typeOf(e *event) string {
	toks := strings.Split(e.rec.Subject, ".")
	if len(toks) < 4 || toks[0] != events.SubjectPrefix {
		return ""
	}
	return events.SubjectPrefix + "." + toks[2] + "." + toks[3]
}

// requests reports whether the core's event r requests call of step of tool (a subject
// token): its tool.requested, or the step's model.responded listing it.
func requests(r *event, step int, call, tool string) bool {
	if r.meta.Step != step {
		return false
	}
	if r.meta.Type == events.TypeToolRequested {
		return r.meta.CallID == call && toolOf(r) == tool
	}
	mr, ok := r.data.(*toolbus.ModelResponded)
	return ok && slices.ContainsFunc(mr.Message.ToolCalls, func(c toolbus.ToolCall) bool {
		return c.CallID == call && events.ToolToken(c.Tool) == tool
	})
}

// requested checks that every call of a step the run went on from (went) was requested:
// the planner publishes, for each of a step's CallCount calls, its tool.requested or
// (a call over the step's cap) a rejected result of its own. So the administrator cannot
// remove a call's request (and the step's model.responded) to pass its results off as
// foreign: the step's other calls still count it.
func requested(evs []*event, went func(step int) bool) error {
	type slot struct{ step, index int }
	count := map[int]int{}
	first := map[int]int{}
	have := map[slot]bool{}
	for i, e := range evs {
		core := e.meta.Type == events.TypeToolRequested || e.meta.Type == events.TypeToolFinished && isCore(e.key)
		if e.foreign || !core || !e.meta.HasCall {
			continue
		}
		if _, ok := first[e.meta.Step]; !ok {
			first[e.meta.Step] = i
		}
		count[e.meta.Step] = max(count[e.meta.Step], e.meta.CallCount)
		have[slot{e.meta.Step, e.meta.CallIndex}] = true
	}
	for _, step := range slices.Sorted(maps.Keys(count)) {
		n := count[step]
		for k := range n {
			if have[slot{step, k}] || !went(step) {
				continue
			}
			e := evs[first[step]]
			return &Failure{Index: first[step], Seq: e.rec.Seq, ID: e.meta.ID, Check: "complete",
				Reason: fmt.Sprintf("call %d of the %d of step %d was never requested, yet the run went on (a request removed)", k+1, n, step)}
		}
	}
	return nil
}
