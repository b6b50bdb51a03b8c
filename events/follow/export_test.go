package follow

import "time"

// ForgetTrust makes the outcome subscriptions untrusted, as a lost message does.
func (e *RunOutcomes) ForgetTrust() {
	e.mu.Lock()
	e.trusted = false
	e.mu.Unlock()
}

// TrustedFrom is the sequence from which the subscriptions are trusted (0: not, or
// from an empty stream on: see Trusted).
func (e *RunOutcomes) TrustedFrom() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.trusted {
		return 0
	}
	return e.from
}

// Trusted reports whether the subscriptions answer for runs started after TrustedFrom.
func (e *RunOutcomes) Trusted() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.trusted
}

// OnStateWrite sets a function called with the run of each terminal run-state write
// before it is recorded (set it before Listen).
func (e *RunOutcomes) OnStateWrite(f func(run string)) { e.stateHook = f }

// SetCatchUp sets how long a lookup waits for the run-state writes received before it.
func (e *RunOutcomes) SetCatchUp(d time.Duration) { e.catchUp = d }
