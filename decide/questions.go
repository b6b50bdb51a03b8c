package decide

import (
	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// QuestionKey names a question of a run: its step, call and seq. The attempt that asked
// it is not part of it: a tool that runs again (its executor died while it waited, or
// its retry policy ran it again) asks its questions again in the same order, and each
// is the question asked before, answered or not.
type QuestionKey struct {
	Step   int
	CallID string
	Seq    int
}

// KeyOf is the key of a question.
func KeyOf(q toolbus.ToolQuestion) QuestionKey { return QuestionKey{q.Step, q.CallID, q.Seq} }

// AnswerKey is the key of the question a answers.
func AnswerKey(a toolbus.ToolAnswer) QuestionKey { return QuestionKey{a.Step, a.CallID, a.Seq} }

// Questions is what a run's events say of its questions to the caller: which were
// asked, which the run's principal answered, which calls finished and whether the run
// ended. One rule for everyone who reads them: the executor (a question answered before
// its tool asks it again is not asked again), `toolbus answer`, the console (the
// question that waits), the MCP door and the read service. Feed it the run's events in
// stream order with Visit.
//
// A question or a result counts only for a call the core recorded (its tool.requested,
// which only the planner and the injector publish) and only on the subject of that
// call's tool (Of): a team writes its own tool's subjects, so what it writes there about
// another tool's call (a question asking for a password in alpha's call, a result that
// closes it) counts for nothing.
type Questions struct {
	principal string
	calls     map[callKey]string // the tool of each call the core requested
	asked     map[QuestionKey]toolbus.ToolQuestion
	answers   map[QuestionKey]toolbus.ToolAnswer
	last      map[string]QuestionKey // per call, its last question asked
	order     []string               // the calls that asked, in the order of their first question
	finished  map[string]bool
	ended     bool
}

// NewQuestions returns an empty Questions.
func NewQuestions() *Questions {
	return &Questions{asked: map[QuestionKey]toolbus.ToolQuestion{}, answers: map[QuestionKey]toolbus.ToolAnswer{},
		last: map[string]QuestionKey{}, finished: map[string]bool{}, calls: map[callKey]string{}}
}

// QuestionsOf reads the questions of a run's events (in stream order: runlog.Events).
func QuestionsOf(evs []runlog.StoredEvent) *Questions {
	q := NewQuestions()
	for _, ev := range evs {
		// The calls first: which tool a call is of is what the core requested, whenever
		// it was stored (only the tool's subjects decide, not the order).
		if ev.Meta.Type == events.TypeToolRequested {
			q.Visit(ev)
		}
	}
	for _, ev := range evs {
		q.Visit(ev)
	}
	return q
}

// Visit reads one event of the run (an event that does not decode counts for nothing).
// It decodes only the types it reads: the executor links no audit package.
func (q *Questions) Visit(ev runlog.StoredEvent) {
	if ev.Err != nil {
		return
	}
	switch typ := ev.Meta.Type; {
	case typ == events.TypeRunStarted:
		var rs toolbus.RunStarted
		if q.principal == "" && ev.Decode(&rs) == nil { // the run's first run.started is the run (a later one is a squat)
			q.principal = rs.Principal.ID
		}
	case typ == events.TypeToolRequested:
		// On the tool's subject, or on _unknown for a call nobody serves (only the core
		// publishes either; a body that disagrees with its subject counts for nothing).
		var req toolbus.ToolRequested
		if ev.Decode(&req) == nil {
			q.calls[callKey{req.Step, req.Call.CallID}] = req.Call.Tool
		}
	case typ == events.TypeToolQuestion:
		var tq toolbus.ToolQuestion
		if ev.Decode(&tq) != nil || !q.Of(ev.Subject, tq.RunID, tq.Step, tq.CallID) {
			return
		}
		k := KeyOf(tq)
		if _, ok := q.last[tq.CallID]; !ok {
			q.order = append(q.order, tq.CallID)
		}
		// The latest asking of a question stands for it (before questions were durable,
		// each attempt asked again, and its answers name its attempt).
		q.asked[k], q.last[tq.CallID] = tq, k
	case typ == events.TypeToolAnswer:
		var a toolbus.ToolAnswer
		if ev.Decode(&a) != nil || !q.Counts(a) {
			return
		}
		if _, ok := q.answers[AnswerKey(a)]; !ok { // the first answer stands
			q.answers[AnswerKey(a)] = a
		}
	case typ == events.TypeToolFinished:
		var f toolbus.ToolFinished
		if ev.Decode(&f) == nil && q.Of(ev.Subject, f.RunID, f.Step, f.CallID) {
			q.finished[f.CallID] = true
		}
	case ev.IsRunEnded():
		var re toolbus.RunEnded
		if ev.Decode(&re) == nil && re.Status.Terminal() { // not run.waiting_for_approval: other calls still run
			q.ended = true
		}
	}
}

// callKey names a call of a run: its step and call id (call ids repeat across steps).
type callKey struct {
	step int
	id   string
}

// CallTool returns the tool of call callID of step as the core requested it (its
// tool.requested), when it did.
func (q *Questions) CallTool(step int, callID string) (string, bool) {
	tool, ok := q.calls[callKey{step, callID}]
	return tool, ok
}

// Of reports whether an event of the call (step, callID) of run stored on subject is
// that call's: the core requested the call, and subject is its tool's question or
// result subject (the event's type agrees with its subject, or it counts for nothing:
// events.CheckSubject). The requests visited so far count (QuestionsOf visits them all
// first; a call's own events follow its request anyway).
func (q *Questions) Of(subject, run string, step int, callID string) bool {
	tool, ok := q.CallTool(step, callID)
	return ok && (subject == events.SubjectToolQuestion(run, tool) || subject == events.SubjectToolFinished(run, tool))
}

// Principal is the run's principal: whose answers count.
func (q *Questions) Principal() string { return q.principal }

// Counts reports whether a is an answer that counts: by the run's principal. The
// executor ignores anyone else's (recorded, it leaves the question open).
func (q *Questions) Counts(a toolbus.ToolAnswer) bool {
	return q.principal != "" && a.Who == q.principal
}

// Asked returns the question k, when it was asked.
func (q *Questions) Asked(k QuestionKey) (toolbus.ToolQuestion, bool) {
	tq, ok := q.asked[k]
	return tq, ok
}

// Answer returns the first answer to question k by the run's principal, when there is
// one (whichever attempt asked it).
func (q *Questions) Answer(k QuestionKey) (toolbus.ToolAnswer, bool) {
	a, ok := q.answers[k]
	return a, ok
}

// Ended reports whether the run ended.
func (q *Questions) Ended() bool { return q.ended }

// Last returns the last question call callID asked, when it asked one.
func (q *Questions) Last(callID string) (toolbus.ToolQuestion, bool) {
	k, ok := q.last[callID]
	if !ok {
		return toolbus.ToolQuestion{}, false
	}
	return q.asked[k], true
}

// Finished reports whether call callID has its result.
func (q *Questions) Finished(callID string) bool { return q.finished[callID] }

// Open returns the questions that wait for an answer, in the order their calls first
// asked: per call, its last question when the run's principal has not answered it, the
// call has no result and the run has not ended.
func (q *Questions) Open() []toolbus.ToolQuestion {
	if q.ended {
		return nil
	}
	var out []toolbus.ToolQuestion
	for _, id := range q.order {
		last, _ := q.Last(id)
		if q.finished[id] {
			continue
		}
		for _, tq := range q.Batch(last) {
			if _, answered := q.answers[KeyOf(tq)]; !answered {
				out = append(out, tq)
			}
		}
	}
	return out
}

// Batch returns the questions asked together with tq (executor.AskAll: its batch) that
// were asked so far, in seq order; tq alone when it was asked alone.
func (q *Questions) Batch(tq toolbus.ToolQuestion) []toolbus.ToolQuestion {
	if tq.BatchSize <= 1 {
		return []toolbus.ToolQuestion{tq}
	}
	var out []toolbus.ToolQuestion
	for s := tq.Batch; s < tq.Batch+tq.BatchSize; s++ {
		if b, ok := q.asked[QuestionKey{tq.Step, tq.CallID, s}]; ok {
			out = append(out, b)
		}
	}
	return out
}
