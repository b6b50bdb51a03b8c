package events

// ForgetTrust makes the outcome subscriptions untrusted, as a lost message does.
func (e *RunOutcomes) ForgetTrust() {
	e.mu.Lock()
	e.from = 0
	e.mu.Unlock()
}

// TrustedFrom is the sequence from which the subscriptions are trusted (0: not).
func (e *RunOutcomes) TrustedFrom() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.from
}

// OnStateWrite sets a function called with the run of each terminal run-state write
// before it is recorded (set it before Listen).
func (e *RunOutcomes) OnStateWrite(f func(run string)) { e.stateHook = f }
