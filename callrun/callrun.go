// Package callrun builds the run of one pre-planned tool call: what `toolbus call` and
// `toolbus mcp` start for a call that names its tool and arguments, with no model; and
// follows such a run to its result (Await) for `toolbus call`.
package callrun

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/toolbus/toolbus"
)

// CallID is the call id of the one call of a pre-planned run.
const CallID = "call_0"

// Slack is added to a tool's timeout for the run's deadline: the executor's own timeout
// answers first, and the run's deadline only covers a call no executor takes.
const Slack = 15 * time.Second

// DefaultToolTimeout bounds a call of a tool whose contract sets no timeout.
const DefaultToolTimeout = time.Minute

// Spec is what a pre-planned run is made of.
type Spec struct {
	// RunID names the run.
	RunID string
	// Principal is who the run acts for.
	Principal toolbus.Principal
	// Tool is the contract of the tool called.
	Tool toolbus.ToolContract
	// Arguments is the call's JSON arguments.
	Arguments string
	// Via names the front door in the run's one user message ("toolbus call").
	Via string
	// Deadline, when set, is the run's deadline from now, whatever the tool says.
	Deadline time.Duration
	// DefaultToolTimeout bounds a tool whose contract sets no timeout (default
	// DefaultToolTimeout).
	DefaultToolTimeout time.Duration
	// ApprovalTimeout is the least deadline of a run whose tool needs approval: the time
	// left to decide.
	ApprovalTimeout time.Duration
}

// Build returns the run.started of spec at now: the call is step 0 (no model is
// called), the allowlist is the tool alone, and the deadline covers the tool's timeout
// plus Slack (for a tool that needs approval, at least ApprovalTimeout).
func Build(spec Spec, now time.Time) toolbus.RunStarted {
	deadline := spec.Deadline
	if deadline <= 0 {
		timeout := spec.Tool.Timeout
		if timeout <= 0 {
			timeout = spec.DefaultToolTimeout
		}
		if timeout <= 0 {
			timeout = DefaultToolTimeout
		}
		deadline = timeout + Slack
		if spec.Tool.NeedsApproval {
			deadline = max(deadline, spec.ApprovalTimeout)
		}
	}
	return toolbus.RunStarted{
		RunID: spec.RunID, Principal: spec.Principal, AllowedTools: []string{spec.Tool.Name},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: spec.Via + " " + spec.Tool.Name}},
		Limits:   toolbus.Limits{MaxSteps: 2, Deadline: now.Add(deadline).UTC()},
		Calls:    []toolbus.ToolCall{{CallID: CallID, Tool: spec.Tool.Name, Arguments: spec.Arguments}},
	}
}

// NewID returns a fresh run id with prefix: prefix-<12 hex digits>.
func NewID(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return prefix + "-" + hex.EncodeToString(b)
}
