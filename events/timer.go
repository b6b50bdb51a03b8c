package events

import "time"

// The deadline timer of a run: one event per run on toolbus.<run>.timer.deadline,
// published by the injector that starts the run. The injector's timer consumer holds it
// (a negative acknowledgement delayed until the deadline: a durable timer kept by the
// server, which survives injector restarts) and ends the run when its deadline passes
// with the run still going.
const (
	TypeRunTimer = "toolbus.timer.deadline"
	FilterTimers = SubjectPrefix + ".*.timer.deadline"
)

// SubjectTimer is toolbus.<run>.timer.deadline.
func SubjectTimer(run string) string { return SubjectPrefix + "." + run + ".timer.deadline" }

// IDTimer is <run>/timer.deadline.
func IDTimer(run string) string { return run + "/timer.deadline" }

// RunTimer is the data of a run's deadline timer.
type RunTimer struct {
	// RunID is the run whose deadline this is.
	RunID string `json:"run_id"`
	// Deadline is the run's deadline (RunStarted.limits.deadline, or the injector's
	// default run timeout from the run's start): the run ends limit_reached / deadline
	// when it passes with the run still going.
	Deadline time.Time `json:"deadline"`
}
