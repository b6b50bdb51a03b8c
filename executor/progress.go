package executor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Progress.
//
// A tool reports how far it has come with Progress(ctx, done, total, message). Each
// report renews the call's liveness: a long-running tool (Tool.HeartbeatTimeout) that
// reports nothing for its heartbeat timeout is timed out, one that keeps reporting runs
// up to its Timeout (never past the call's or the run's deadline, which bound the
// context). The executor hands each report to the sink of the context given to Execute
// (WithProgressSink): the bus worker publishes them as tool.progress events, throttled.

// ErrNotRunning is wrapped by the error of a report that no running call can take: it
// was made outside a tool call, or after the call ended (returned, timed out or was
// cancelled; its result already says what happened). The report is dropped.
var ErrNotRunning = errors.New("executor: progress for a call that is not running")

// ErrInvalidProgress is wrapped by the error of a report with values that mean nothing
// (negative, not a number, infinite).
var ErrInvalidProgress = errors.New("executor: invalid progress")

// ProgressReport is one report of a running call.
type ProgressReport struct {
	// Done is the work done so far, in the tool's unit; Total the whole work (0: unknown).
	Done, Total float64
	// Message says what the tool is doing, for people.
	Message string
	// At is when the tool reported.
	At time.Time
}

// ProgressSink receives the reports of the calls run under a context
// (WithProgressSink). It is called on the tool's goroutine and must not block.
type ProgressSink func(ProgressReport)

type progressSinkKey struct{}

// progressKey finds the running call's context (a *callCtx) from a tool's context.
type progressKey struct{}

// WithProgressSink returns a context whose calls hand their progress reports to sink
// (the bus worker's publisher). Without one, reports only renew the call's liveness.
func WithProgressSink(ctx context.Context, sink ProgressSink) context.Context {
	return context.WithValue(ctx, progressSinkKey{}, sink)
}

// Progress reports that the call running under ctx has done done of total (total 0:
// unknown) and is doing message. It renews the call's liveness (see
// Tool.HeartbeatTimeout) and reaches the bus as a tool.progress event (at most one per
// call per interval, the latest kept). It returns an error wrapping ErrNotRunning for a
// ctx that is not a running call's (the report is dropped: nothing else changes), and
// ErrInvalidProgress for values that mean nothing.
func Progress(ctx context.Context, done, total float64, message string) error {
	c, _ := ctx.Value(progressKey{}).(*callCtx)
	if c == nil {
		return fmt.Errorf("%w: no tool call in this context (call Progress with the context the tool was given)", ErrNotRunning)
	}
	for _, v := range []float64{done, total} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: done %v, total %v: want finite numbers of 0 or more", ErrInvalidProgress, done, total)
		}
	}
	return c.progress(ProgressReport{Done: done, Total: total, Message: message, At: time.Now()})
}

// progress renews the call's liveness and hands r to the sink, unless the call ended.
func (c *callCtx) progress(r ProgressReport) error {
	c.mu.Lock()
	if c.err == nil {
		c.checkLocked()
	}
	if c.err != nil {
		why := c.ended
		if why == "" {
			why = c.err.Error()
		}
		c.mu.Unlock()
		return fmt.Errorf("%w: the call already ended (%s); this report was dropped", ErrNotRunning, why)
	}
	c.lastBeat = r.At
	sink := c.sink
	c.mu.Unlock()
	if sink != nil {
		sink(r)
	}
	return nil
}

// sinceBeat returns how long ago the call last reported (or started).
func (c *callCtx) sinceBeat() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(c.lastBeat)
}

// end ends the call's context with err, recording why for late reports.
func (c *callCtx) end(err error, why string) {
	c.mu.Lock()
	if c.err == nil {
		c.ended = why
		c.endLocked(err)
	}
	c.mu.Unlock()
}
