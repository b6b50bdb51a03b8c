package audit

import (
	"time"

	"github.com/toolbus/toolbus"
)

// Violation codes of the report.
const (
	ViolationNoRunStarted    = "no_run_started"    // the run's events have no run.started
	ViolationUndecodable     = "undecodable_event" // a message on the run's subjects is not a toolbus event
	ViolationDuplicateResult = "duplicate_result"  // more than one tool.finished for one call (step + call_id)
	ViolationOrphanResult    = "orphan_result"     // a tool.finished with no tool.requested before it
	ViolationMissingResult   = "missing_result"    // a tool.requested that never got its result
	ViolationMissingRequest  = "missing_request"   // a call the model asked for was never requested, yet the run went on
	ViolationCallOrder       = "call_order"        // a request or result whose call_index is not the call's position
	ViolationUnknownCall     = "unknown_call"      // a request for a call the model did not ask for
	ViolationStepOrder       = "step_order"        // a step requested out of order or before the results it needs
	ViolationTerminal        = "terminal_state"    // not exactly one terminal outcome, last
	// ViolationSubjectMismatch: an event whose subject and body disagree (another run,
	// tool, status or type than its subject names); consumers terminated it and it
	// counts for no run.
	ViolationSubjectMismatch = "subject_mismatch"
	// ViolationProgressNotRunning: a tool.progress for a call that was not running (no
	// tool.requested before it, or after its tool.finished); readers ignore it.
	ViolationProgressNotRunning = "progress_not_running"
)

// Violation is one broken invariant.
type Violation struct {
	Code    string `json:"code"`
	Seq     uint64 `json:"seq,omitempty"`
	Step    int    `json:"step"`
	CallID  string `json:"call_id,omitempty"`
	Message string `json:"message"`
}

// TimelineEntry is one event of the timeline, in stream order.
type TimelineEntry struct {
	Seq        uint64   `json:"seq"`
	AtMS       int64    `json:"at_ms"`
	Type       string   `json:"type"`
	Step       int      `json:"step"`
	CallID     string   `json:"call_id,omitempty"`
	Tool       string   `json:"tool,omitempty"`
	Status     string   `json:"status,omitempty"`
	Code       string   `json:"code,omitempty"`
	DurationMS int64    `json:"duration_ms,omitempty"`
	Executor   string   `json:"executor,omitempty"`
	Source     string   `json:"source,omitempty"`
	Summary    string   `json:"summary"`
	Details    []string `json:"details,omitempty"`
	// AfterEnd marks events stored after the run's terminal outcome (late results,
	// ignored approvals).
	AfterEnd bool `json:"after_end,omitempty"`
}

// ModelRequest says how much of the transcript the model was sent at a step.
type ModelRequest struct {
	Step     int    `json:"step"`
	Seq      uint64 `json:"seq"`
	Messages int    `json:"messages"`
}

// Call is the audit of one call.
type Call struct {
	Step      int    `json:"step"`
	Index     int    `json:"index"`
	CallID    string `json:"call_id"`
	Tool      string `json:"tool"`
	Arguments string `json:"arguments"`
	Requested int    `json:"requested"`
	Waited    bool   `json:"waited,omitempty"`
	Decision  string `json:"decision,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"`
	// DecidedWhy is the reason the decider gave.
	DecidedWhy string `json:"decided_why,omitempty"`
	// DecisionKind is what the person decided (toolbus.Approval.Kind): approved, edited,
	// rejected or responded.
	DecisionKind string `json:"decision_kind,omitempty"`
	// EditedArguments are the person's arguments the call ran with instead of the
	// model's (Arguments), for an edit.
	EditedArguments string `json:"edited_arguments,omitempty"`
	// Response is the person's answer in the tool's place, for a response.
	Response string              `json:"response,omitempty"`
	Results  int                 `json:"results"`
	Result   *toolbus.ToolResult `json:"result,omitempty"`
	// Progress is the call's last progress report while it ran (tool.progress).
	Progress *toolbus.ToolProgress `json:"progress,omitempty"`
}

// ProgressText says how far the call had come by its last report ("" without one).
func (c Call) ProgressText() string {
	if c.Progress == nil {
		return ""
	}
	return ProgressText(*c.Progress)
}

// Report is the audit of one run (`toolbus replay --json` prints it as is).
type Report struct {
	RunID   string             `json:"run_id"`
	Status  toolbus.RunStatus  `json:"status"`
	Code    string             `json:"code,omitempty"`
	Reason  string             `json:"reason,omitempty"`
	Answer  string             `json:"answer,omitempty"`
	Pending []toolbus.ToolCall `json:"pending,omitempty"`
	// Model is the model the run named (RunStarted.Model), else the one that answered
	// its first step (the planner's own).
	Model      string          `json:"model,omitempty"`
	Principal  string          `json:"principal,omitempty"`
	Limits     toolbus.Limits  `json:"limits"`
	StartedAt  time.Time       `json:"started_at,omitzero"`
	DurationMS int64           `json:"duration_ms"`
	Steps      int             `json:"steps"`
	Usage      toolbus.Usage   `json:"usage"`
	Events     int             `json:"events"`
	Timeline   []TimelineEntry `json:"timeline"`
	Calls      []Call          `json:"calls"`
	// Transcript is the conversation as the model was sent it: the run's input
	// messages, then per step the assistant message whole and its tool messages in call
	// order; the last message is the model's last answer. Requests say how many of
	// these messages each step's request carried.
	Transcript []toolbus.Message `json:"transcript"`
	Requests   []ModelRequest    `json:"model_requests"`
	Violations []Violation       `json:"violations"`
	OK         bool              `json:"ok"`
}
