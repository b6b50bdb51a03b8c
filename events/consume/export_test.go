package consume

// The stall watch's thresholds, for the tests that drive it.
const (
	StallBurst   = stallBurst
	StallSilence = stallSilence
)
