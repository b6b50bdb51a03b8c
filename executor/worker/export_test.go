package worker

// SetTakeoverHook sets the hook that runs right after a claim is taken over (nil
// removes it). Set it before the worker runs and remove it after it stopped.
func SetTakeoverHook(f func()) { takeoverHook = f }
