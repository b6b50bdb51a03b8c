package injector

import (
	"fmt"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/store"
)

// DefaultFailOn are the error codes that fail a run instead of going back to the model.
var DefaultFailOn = []string{toolbus.CodeUnknownTool, toolbus.CodeToolInternalError, toolbus.CodeInvalidToolOutput, toolbus.CodePermissionDenied}

// Rules are the stop rules applied when a step's results are all in.
type Rules struct {
	// FailOn lists unrecoverable error codes (default DefaultFailOn).
	FailOn []string
	// Now returns the current time (tests).
	Now func() time.Time
}

func (r *Rules) setDefaults() {
	if r.FailOn == nil {
		r.FailOn = DefaultFailOn
	}
	if r.Now == nil {
		r.Now = time.Now
	}
}

// Decide returns the outcome of a complete step: nil to continue with the next model
// request, or the run outcome to publish. rs carries the run's limits with the
// injector's defaults applied (RunStarted.WithDefaults); a run with no step limit gets
// DefaultMaxSteps.
func (r Rules) Decide(rs *toolbus.RunStarted, rec *store.StepRecord) *toolbus.RunEnded {
	r.setDefaults()
	for _, res := range rec.Results {
		if res == nil || res.Error == nil {
			continue
		}
		for _, code := range r.FailOn {
			if res.Error.Code == code {
				return &toolbus.RunEnded{RunID: rec.RunID, Status: toolbus.RunFailed, Code: code, StepsUsed: rec.Step + 1,
					Reason: fmt.Sprintf("call %s (%s) %s: %s", res.CallID, res.Tool, res.Status, res.Error.Message)}
			}
		}
	}
	maxSteps := rs.Limits.MaxSteps
	if maxSteps <= 0 {
		maxSteps = DefaultMaxSteps
	}
	if rec.Step+1 >= maxSteps {
		return &toolbus.RunEnded{RunID: rec.RunID, Status: toolbus.RunLimitReached, Code: toolbus.LimitMaxSteps,
			StepsUsed: rec.Step + 1, Reason: fmt.Sprintf("max steps %d reached", maxSteps)}
	}
	if d := rs.Limits.Deadline; !d.IsZero() && r.Now().After(d) {
		return &toolbus.RunEnded{RunID: rec.RunID, Status: toolbus.RunLimitReached, Code: toolbus.LimitDeadline,
			StepsUsed: rec.Step + 1, Reason: "run deadline " + d.Format(time.RFC3339) + " passed"}
	}
	return nil
}
