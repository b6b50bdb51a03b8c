package callrun

import (
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events/runlog"
)

// Own tells the pre-planned call's own events from others that name it: an event counts
// for the call only when it names the call the core requested (its tool.requested, read
// by the one rule of decide.Questions) and that call's tool, whose subjects the event is
// then on (a body that disagrees with its subject counts for nothing). A team writes its
// own tool's subjects: its question, result, wait, progress or log naming this call is
// not the call's, and reaches neither `toolbus call` nor the MCP door's host.
type Own struct{ qs *decide.Questions }

// NewOwn returns an Own that has seen no event.
func NewOwn() *Own { return &Own{decide.NewQuestions()} }

// Visit reads one event of the run, in stream order (before the caller acts on it).
func (o *Own) Visit(ev runlog.StoredEvent) { o.qs.Visit(ev) }

// Is reports whether an event of tool naming call callID of step is the call's.
func (o *Own) Is(step int, callID, tool string) bool {
	called, ok := o.qs.CallTool(step, callID)
	return ok && step == 0 && callID == CallID && tool == called
}
