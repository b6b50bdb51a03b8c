// Package timeline renders runs' events as the lines a person reads in a terminal: the
// timeline `toolbus run` and `toolbus call` print as a run goes on, the coloured lines of
// `toolbus tail`, the runs table of `toolbus runs`, and what a silent run waits for.
package timeline

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Printer renders a run's events as a human timeline.
type Printer struct {
	out io.Writer
	// last is the type of the last event printed, and open the calls of the current step
	// without a result (call id -> tool): what the run waits for.
	last string
	open map[string]string
	// run is the run's id (from its run.started), principal who it acts for.
	run, principal string
	// model is the model the planner answered with, printed when it first shows.
	model string
	// requested is the model the run named, if any.
	requested string
	// Timers prints the run's deadline timer (tail); a run's own timeline leaves it out.
	Timers bool
	// finished holds the calls with a result (run/step/call id): their progress reports
	// are ignored.
	finished map[string]bool
	// called is the tool the core requested of each call (run/step/call id): another
	// tool's question naming the call is no question of it (decide.Questions).
	called map[string]string
	// What the open calls' executors recorded on their tools' subjects (by call id):
	// reported holds a call an executor reported on (its last progress, "" for a log
	// line), waiting one that waits for approval; questions the run's questions.
	reported  map[string]string
	waiting   map[string]bool
	questions *decide.Questions
	// starts are the first run.started of each run: who its decisions count from.
	starts map[string]toolbus.RunStarted
}

// NewPrinter returns a printer writing to out.
func NewPrinter(out io.Writer) *Printer {
	return &Printer{out: out, open: map[string]string{}, finished: map[string]bool{}, called: map[string]string{},
		reported: map[string]string{}, waiting: map[string]bool{}, questions: decide.NewQuestions(), starts: map[string]toolbus.RunStarted{}}
}

// callKey names a call across runs.
func callKey(run string, step int, callID string) string {
	return run + "/" + strconv.Itoa(step) + "/" + callID
}

// WaitingFor says what the run waits for after the last event printed, and the durable
// consumers whose workers would serve it. Of an open call it says what its executor
// recorded on the tool's own subjects: nothing yet (an executor of the tool must take
// it), reports (an executor runs it), a question (with the command that answers it) or
// a wait for approval (with the command that decides it).
func (p *Printer) WaitingFor() (string, []string) {
	switch p.last {
	case "", events.TypeRunStarted, events.TypeToolFinished:
		return "the injector", []string{events.ConsumerInjector + "-started", events.ConsumerInjector}
	case events.TypeModelRequested:
		return "the planner (the model's answer)", []string{events.ConsumerPlanner}
	case events.TypeModelResponded, events.TypeToolRequested, events.TypeToolWaiting, events.TypeApprovalGranted, events.TypeApprovalDenied:
		if len(p.open) == 0 {
			return "the injector", []string{events.ConsumerInjector}
		}
		return p.waitingForCalls()
	}
	return "the next event", nil
}

// waitingForCalls says what each open call waits for, in call id order, and the queues
// of the tools none of whose executors reported on a call yet.
func (p *Printer) waitingForCalls() (string, []string) {
	questions := map[string]toolbus.ToolQuestion{}
	for _, q := range p.questions.Open() {
		if p.open[q.CallID] == q.Tool { // asked on the call's own tool's subject
			questions[q.CallID] = q
		}
	}
	var whats, idle []string
	for _, id := range slices.Sorted(maps.Keys(p.open)) {
		tool := p.open[id]
		q, asked := questions[id]
		report, running := p.reported[id]
		switch {
		case asked:
			whats = append(whats, fmt.Sprintf("an answer to the question of %s %s: %q; answer it: %s", id, tool, oneLine(q.Message, 100), decide.AnswerCommand(q)))
		case p.waiting[id]:
			whats = append(whats, fmt.Sprintf("approval of %s %s: %s", id, tool, decide.ApproveCommand(p.run, id)))
		case running && report != "":
			whats = append(whats, fmt.Sprintf("%s %s, which an executor is running (last report: %s)", id, tool, report))
		case running:
			whats = append(whats, fmt.Sprintf("%s %s, which an executor is running", id, tool))
		default:
			whats = append(whats, fmt.Sprintf("an executor of %s to take %s (none has reported on it yet)", tool, id))
			if !slices.Contains(idle, tool) {
				idle = append(idle, tool)
			}
		}
	}
	var cons []string
	slices.Sort(idle)
	for _, tool := range idle {
		cons = append(cons, events.ToolConsumer(tool))
	}
	return strings.Join(whats, "; "), cons
}

// ResultLine renders one tool result of the timeline.
func ResultLine(r toolbus.ToolResult) string {
	var line string
	// Each attempt the tool's retry policy retried, then the result the model reads.
	for _, fa := range r.Retries {
		line += fmt.Sprintf("        <- %s %s: attempt %d %s %s (%s) on %s, retried after %d ms\n", r.CallID, r.Tool, fa.Attempt,
			fa.Status, fa.Error.Code, oneLine(fa.Error.Message, 60), fa.Executor, fa.RetryAfterMS)
	}
	line += fmt.Sprintf("        <- %s %s: %s", r.CallID, r.Tool, r.Status)
	if r.Error != nil {
		if r.Error.Code != string(r.Status) { // not "cancelled cancelled"
			line += " " + r.Error.Code
		}
		line += " (" + oneLine(r.Error.Message, 80) + ")"
	}
	line += fmt.Sprintf(" in %d ms on %s", r.DurationMS, r.Executor)
	if r.Truncated != nil {
		line += fmt.Sprintf(" [content truncated %d -> %d bytes]", r.Truncated.OriginalBytes, r.Truncated.KeptBytes)
	}
	for _, a := range r.Attachments {
		line += fmt.Sprintf(" [%s %s, %d bytes]", a.Kind(), a.MediaType, a.Size)
	}
	if r.Human != nil {
		line += fmt.Sprintf(" [%s by %s]", r.Human.Kind, r.Human.Who)
	}
	return line
}

// Print renders one event; it reports the run status and whether the run stopped.
func (p *Printer) Print(ev runlog.StoredEvent) (status toolbus.RunStatus, done bool) {
	if ev.Err == nil && ev.Meta.Type != events.TypeToolProgress && ev.Meta.Type != events.TypeToolLog &&
		ev.Meta.Type != events.TypeToolQuestion && ev.Meta.Type != events.TypeToolAnswer {
		p.last = ev.Meta.Type // a report or a log line changes nothing the run waits for
	}
	p.questions.Visit(ev)
	v := audit.Visitor{
		Undecodable: func(ev runlog.StoredEvent, err error) {
			switch {
			case errors.Is(ev.Err, events.ErrSubjectMismatch):
				fmt.Fprintf(p.out, "  ! ignored %s #%d: %v\n", ev.Meta.Type, ev.Seq, err)
			case ev.Err != nil:
				fmt.Fprintf(p.out, "  ? undecodable message on %s: %v\n", ev.Subject, err)
			}
		},
		RunStarted: func(_ runlog.StoredEvent, rs toolbus.RunStarted) {
			if _, ok := p.starts[rs.RunID]; !ok {
				p.starts[rs.RunID] = rs
			}
			p.principal = rs.Principal.ID
			q := ""
			for _, m := range rs.Messages {
				if m.Role == toolbus.RoleUser {
					q = m.Content
				}
			}
			// A run names a model only when asked to (toolbus run --model); otherwise the
			// planner answers with its own, which its first answer names.
			p.requested = rs.Model
			if p.run == "" {
				p.run = rs.RunID
			}
			fmt.Fprintf(p.out, "run %s started: %q\n", rs.RunID, q)
		},
		ModelResponded: func(_ runlog.StoredEvent, mr toolbus.ModelResponded) { p.modelResponded(mr) },
		ToolFinished: func(_ runlog.StoredEvent, tf toolbus.ToolFinished) {
			delete(p.open, tf.CallID)
			p.finished[callKey(tf.RunID, tf.Step, tf.CallID)] = true
			fmt.Fprintln(p.out, ResultLine(tf.ToolResult))
		},
		ToolProgress: func(_ runlog.StoredEvent, tp toolbus.ToolProgress) {
			if p.finished[callKey(tp.RunID, tp.Step, tp.CallID)] {
				fmt.Fprintf(p.out, "  ! ignored tool.progress %d of %s %s: the call is not running (it has its result)\n", tp.Seq, tp.CallID, tp.Tool)
				return
			}
			p.report(tp.CallID, tp.Tool, audit.ProgressText(tp))
			fmt.Fprintf(p.out, "        .. %s %s %s\n", tp.CallID, tp.Tool, audit.ProgressText(tp))
		},
		ToolLog: func(_ runlog.StoredEvent, tl toolbus.ToolLog) {
			if !p.finished[callKey(tl.RunID, tl.Step, tl.CallID)] {
				p.report(tl.CallID, tl.Tool, "")
				fmt.Fprintf(p.out, "        .. %s %s log %s: %s\n", tl.CallID, tl.Tool, tl.Level, oneLine(tl.Message, 100))
			}
		},
		ToolRequested: func(_ runlog.StoredEvent, tr toolbus.ToolRequested) {
			p.called[callKey(tr.RunID, tr.Step, tr.Call.CallID)] = tr.Call.Tool
			delete(p.waiting, tr.Call.CallID) // issued again: a decision stood
		},
		ToolQuestion: func(_ runlog.StoredEvent, q toolbus.ToolQuestion) { p.toolQuestion(q) },
		ToolAnswer:   func(_ runlog.StoredEvent, a toolbus.ToolAnswer) { p.toolAnswer(a) },
		ToolWaiting:  func(_ runlog.StoredEvent, tw toolbus.ToolWaiting) { p.toolWaiting(tw) },
		Approval:     func(ev runlog.StoredEvent, a toolbus.Approval, _ bool) { p.approval(ev, a) },
		Cancel:       func(runlog.StoredEvent, toolbus.Cancel) { fmt.Fprintln(p.out, "cancel requested") },
		Timer: func(_ runlog.StoredEvent, t events.RunTimer) {
			if p.Timers {
				fmt.Fprintf(p.out, "deadline timer set: the run ends at %s if it still goes on\n", t.Deadline.UTC().Format(time.RFC3339))
			}
		},
		Other: func(ev runlog.StoredEvent) {
			fmt.Fprintf(p.out, "  ? event %s (unknown to this version of toolbus)\n", ev.Meta.Type)
		},
		RunEnded: func(_ runlog.StoredEvent, re toolbus.RunEnded) {
			fmt.Fprintf(p.out, "run %s: %s after %d step(s), %d tokens", re.RunID, re.Status, re.StepsUsed, re.Usage.Total())
			if re.Code != "" {
				fmt.Fprintf(p.out, " [%s]", re.Code)
			}
			fmt.Fprintln(p.out)
			if re.Reason != "" {
				fmt.Fprintf(p.out, "reason: %s\n", re.Reason)
			}
			for _, c := range re.Pending {
				fmt.Fprintf(p.out, "pending: %s %s(%s)\n", c.CallID, c.Tool, oneLine(c.Arguments, 80))
			}
			if re.Answer != "" {
				fmt.Fprintf(p.out, "answer: %s\n", re.Answer)
			}
			status, done = re.Status, re.Status != toolbus.RunRunning
		},
	}
	v.Visit(ev)
	return status, done
}

// toolQuestion prints a call's question, or that it was ignored: another tool's question
// naming the call is no question of it (decide.Questions).
func (p *Printer) toolQuestion(q toolbus.ToolQuestion) {
	if tool, ok := p.called[callKey(q.RunID, q.Step, q.CallID)]; ok && tool != q.Tool {
		fmt.Fprintf(p.out, "  ! ignored tool.question of %s on %s's subject: the call is of %s\n", q.CallID, q.Tool, tool)
		return
	}
	p.report(q.CallID, q.Tool, "") // its executor runs it and asks
	fmt.Fprintf(p.out, "        .. %s %s asks its caller: %s\n", q.CallID, q.Tool, oneLine(q.Message, 100))
}

// toolAnswer prints the answer to a call's question.
func (p *Printer) toolAnswer(a toolbus.ToolAnswer) {
	line := fmt.Sprintf("        .. %s %s answered by %s: %s", a.CallID, a.Tool, a.Who, a.Action)
	if len(a.Content) > 0 {
		line += " " + oneLine(string(a.Content), 100)
	}
	if a.Reason != "" {
		line += " (" + oneLine(a.Reason, 100) + ")"
	}
	fmt.Fprintln(p.out, line)
}

// modelResponded prints a step's answer: the model (when it changes), the calls asked for.
func (p *Printer) modelResponded(mr toolbus.ModelResponded) {
	if mr.Model != "" && mr.Model != p.model {
		p.model = mr.Model
		whose := "the planner's"
		if p.requested != "" {
			whose = "asked for by the run: " + audit.ModelName(p.requested)
		}
		fmt.Fprintf(p.out, "model %s (%s)\n", mr.Model, whose)
	}
	clear(p.open)
	clear(p.reported)
	clear(p.waiting)
	for _, c := range mr.Message.ToolCalls {
		p.open[c.CallID] = c.Tool
	}
	text := oneLine(mr.Message.Content, 100)
	if len(mr.Message.ToolCalls) == 0 {
		fmt.Fprintf(p.out, "step %d  model answered (%d ms)\n", mr.Step, mr.LatencyMS)
		return
	}
	fmt.Fprintf(p.out, "step %d  model asked for %d call(s) (%d ms)", mr.Step, len(mr.Message.ToolCalls), mr.LatencyMS)
	if text != "" {
		fmt.Fprintf(p.out, ": %s", text)
	}
	fmt.Fprintln(p.out)
	for _, c := range mr.Message.ToolCalls {
		fmt.Fprintf(p.out, "        -> %s %s(%s)\n", c.CallID, c.Tool, oneLine(c.Arguments, 80))
	}
}

// toolWaiting prints a call that waits for approval, and records it (on its tool's own
// subject) for WaitingFor.
func (p *Printer) toolWaiting(tw toolbus.ToolWaiting) {
	if p.open[tw.Call.CallID] == tw.Call.Tool {
		p.waiting[tw.Call.CallID] = true
	}
	fmt.Fprintf(p.out, "        .. %s %s waits for approval\n", tw.Call.CallID, tw.Call.Tool)
}

// report records that the executor of call callID of tool reported on it (what: its
// last progress, or "" for a log line): an executor runs it. A report on another tool's
// subject than the call's is not its executor's.
func (p *Printer) report(callID, tool, what string) {
	if p.open[callID] != tool {
		return
	}
	if what == "" {
		what = p.reported[callID]
	}
	p.reported[callID] = what
}

// approval prints a person's decision, with an edit's arguments or an answer. A
// decision by the run's principal or an approver decides the call; anyone may write one
// on their own subject, and another's stands only where the injector's TOOLBUS_DECIDERS
// names them (the call is then issued again): it leaves the call waiting here.
func (p *Printer) approval(ev runlog.StoredEvent, a toolbus.Approval) {
	line := fmt.Sprintf("        %s %s by %s %s", strings.TrimPrefix(ev.Meta.Type, "toolbus."), a.CallID, a.Who, a.Why)
	if rs, ok := p.starts[a.RunID]; ok && !rs.NamesDecider(a.Who) {
		line = strings.TrimRight(line, " ") + fmt.Sprintf(" (%s is neither the run's principal nor an approver: it stands only if the injector's TOOLBUS_DECIDERS names %s)", a.Who, a.Who)
	} else {
		delete(p.waiting, a.CallID) // decided: the call is issued again, or answered
	}
	if a.Arguments != "" {
		line += " edited arguments: " + oneLine(a.Arguments, 80)
	}
	if a.Response != "" {
		line += " answer: " + oneLine(a.Response, 80)
	}
	fmt.Fprintln(p.out, strings.TrimRight(line, " "))
}

// oneLine folds s onto one line and cuts it to n bytes (audit.OneLine).
func oneLine(s string, n int) string { return audit.OneLine(s, n) }
