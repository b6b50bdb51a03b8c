package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
)

// MaxLogLines is the most log lines one attempt of a call publishes as tool.log
// events; the lines past it are counted in one more, last, tool.log (Dropped).
const MaxLogLines = 100

// logPublisher publishes the log records of one running call as tool.log events, in
// order, from a goroutine of its own (started at the first record: most tools never
// log), so the tool never waits for the bus. Records past MaxLogLines are counted and
// the count is published last.
type logPublisher struct {
	w    *Worker
	base toolbus.ToolLog
	lv   leaseView
	ch   chan toolbus.ToolLog
	done chan struct{}

	mu           sync.Mutex // a tool may log from several goroutines
	seq, dropped int
	started      bool
	closed       bool // stop was called: a late record is dropped
}

// startLogs returns the sink of a call's log records and stop, which returns once
// every accepted record was published (or given up on).
func (w *Worker) startLogs(ctx context.Context, req toolbus.ToolRequested, attempt int, lv leaseView) (executor.LogSink, func()) {
	p := &logPublisher{w: w, lv: lv, ch: make(chan toolbus.ToolLog, MaxLogLines+1), done: make(chan struct{}),
		base: toolbus.ToolLog{RunID: req.RunID, Step: req.Step, CallID: req.Call.CallID, Tool: req.Call.Tool, Attempt: attempt}}
	sink := func(r executor.LogRecord) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed {
			return
		}
		if p.seq >= MaxLogLines {
			p.dropped++
			return
		}
		tl := p.base
		p.seq++
		tl.Seq, tl.Level, tl.Message, tl.Attrs = p.seq, r.Level, r.Message, r.Attrs
		if !p.started {
			p.started = true
			go p.run(context.WithoutCancel(ctx))
		}
		p.ch <- tl // never blocks: at most MaxLogLines+1 are ever sent
	}
	stop := func() {
		p.mu.Lock()
		p.closed = true
		if p.dropped > 0 {
			tl := p.base
			tl.Seq, tl.Level, tl.Dropped = p.seq+1, "warning", p.dropped
			tl.Message = fmt.Sprintf("%d more log lines of this call were not published (at most %d per call)", p.dropped, MaxLogLines)
			p.ch <- tl
		}
		close(p.ch)
		started := p.started
		p.mu.Unlock()
		if started {
			<-p.done
		}
	}
	return sink, stop
}

func (p *logPublisher) run(ctx context.Context) {
	defer close(p.done)
	for tl := range p.ch {
		if !p.lv.valid() {
			continue // the lease ran out: another attempt may own the call
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := p.w.bus.PublishEvent(pctx, events.ToolLogEvent(p.w.source, tl)); err != nil {
			p.w.log.Warn("tool log line not published", "run_id", tl.RunID, "call_id", tl.CallID, "tool", tl.Tool, "seq", tl.Seq, "error", err)
		}
		cancel()
	}
}
