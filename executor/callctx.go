package executor

import (
	"context"
	"sync"
	"time"
)

// callCtx is the context a Func runs under: the caller's context plus the call's
// deadline. Unlike context.WithDeadline, its Done channel and timer are only created
// when a tool first asks for Done, so tools that never wait on ctx cost no timer; the
// executor itself waits with a pooled timer.
type callCtx struct {
	parent   context.Context
	deadline time.Time

	mu         sync.Mutex
	done       chan struct{} // created by the first Done call
	err        error
	timer      *time.Timer
	stopParent func() bool

	// Progress (progress.go): the sink of the reports, when the last one was made (or
	// the call started), and why the call ended, for a report made after.
	sink     ProgressSink
	lastBeat time.Time
	ended    string
	// logSink redacts and hands on the tool's log records (toollog.go); nil: dropped.
	logSink func(level, msg string, attrs map[string]any, at time.Time)
	// asker asks the run's caller the tool's questions (ask.go); nil: nobody can.
	asker Asker
	// asked counts the questions asked (host.go: their seqs), under mu.
	asked int
}

var _ context.Context = (*callCtx)(nil)

// Deadline returns the call's deadline: min(start + tool timeout, parent deadline).
func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Value looks key up in the parent (CallInfo, trace context, ...); progressKey finds
// the call itself (Progress).
func (c *callCtx) Value(key any) any {
	if _, ok := key.(progressKey); ok {
		return c
	}
	return c.parent.Value(key)
}

// Done returns a channel closed at the deadline, when the parent ends, or when the
// executor ends the call; the first call starts the timer.
func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if c.err != nil { // ended before anyone asked for Done
		close(c.done)
		return c.done
	}
	if c.checkLocked(); c.err != nil { // endLocked closed c.done
		return c.done
	}
	c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.cancel(context.DeadlineExceeded) })
	if c.parent.Done() != nil {
		c.stopParent = context.AfterFunc(c.parent, func() { c.cancel(c.parent.Err()) })
	}
	return c.done
}

// Err returns nil while the call runs, then DeadlineExceeded or Canceled (or the
// parent's error).
func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.checkLocked()
	}
	return c.err
}

// checkLocked ends the context if its parent ended or its deadline passed (for
// callers that only poll Err, with no timer running).
func (c *callCtx) checkLocked() {
	if err := c.parent.Err(); err != nil {
		c.endLocked(err)
	} else if !time.Now().Before(c.deadline) {
		c.endLocked(context.DeadlineExceeded)
	}
}

// cancel ends the context with err (first call wins) and releases its timer.
func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.endLocked(err)
	}
	c.mu.Unlock()
}

func (c *callCtx) endLocked(err error) {
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.stopParent != nil {
		c.stopParent()
	}
}

// String names the context type (for fmt and debugging).
func (c *callCtx) String() string { return "executor.callCtx" }
