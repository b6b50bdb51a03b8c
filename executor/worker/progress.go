package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
)

// DefaultProgressInterval is the least time between two tool.progress events of a call.
const DefaultProgressInterval = time.Second

// progressPublisher publishes the progress reports of one running call as tool.progress
// events: at most one per interval, the latest report kept (a report made within the
// interval replaces the pending one), and the last pending one before the call's
// result. The tool hands reports over without blocking (report); one goroutine,
// started at the first report (most tools never report), publishes them.
type progressPublisher struct {
	w     *Worker
	ctx   context.Context
	msg   jetstream.Msg
	base  toolbus.ToolProgress // the call: run, step, call id, tool, attempt
	lv    leaseView
	every time.Duration

	mu      sync.Mutex
	seq     int
	pending *toolbus.ToolProgress
	started bool

	wake chan struct{} // a report is pending
	stop chan struct{} // the call is over: publish what is pending and return
	done chan struct{}
}

// startProgress starts the publisher of a call's reports; stop publishes the last
// pending report and returns once nothing more will be published.
func (w *Worker) startProgress(ctx context.Context, msg jetstream.Msg, req toolbus.ToolRequested, attempt int, lv leaseView) (sink executor.ProgressSink, stop func()) {
	p := &progressPublisher{
		w: w, ctx: ctx, msg: msg, lv: lv, every: w.cfg.ProgressInterval,
		base: toolbus.ToolProgress{RunID: req.RunID, Step: req.Step, CallID: req.Call.CallID, Tool: req.Call.Tool, Attempt: attempt},
	}
	return p.report, p.finish
}

// report keeps r as the pending report and wakes the publisher (started at the first
// report). A report after finish is dropped: the executor refuses those to the tool.
func (p *progressPublisher) report(r executor.ProgressReport) {
	p.mu.Lock()
	if p.stop == nil {
		p.wake, p.stop, p.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	}
	select {
	case <-p.stop:
		p.mu.Unlock()
		return
	default:
	}
	p.seq++
	tp := p.base
	tp.Seq, tp.Done, tp.Total, tp.Message = p.seq, r.Done, r.Total, r.Message
	p.pending = &tp
	if !p.started {
		p.started = true
		go p.run(context.WithoutCancel(p.ctx))
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default: // already woken: it will publish the latest
	}
}

// finish publishes the last pending report and returns once nothing more will be.
func (p *progressPublisher) finish() {
	p.mu.Lock()
	started := p.started
	if p.stop == nil {
		p.stop = make(chan struct{})
	}
	close(p.stop)
	p.mu.Unlock()
	if started {
		<-p.done
	}
}

func (p *progressPublisher) log() *slog.Logger {
	return p.w.log.With("run_id", p.base.RunID, "step", p.base.Step, "call_id", p.base.CallID, "tool", p.base.Tool)
}

func (p *progressPublisher) run(ctx context.Context) {
	defer close(p.done)
	var last time.Time
	for {
		select {
		case <-p.stop:
			p.publish(ctx)
			return
		case <-p.wake:
		}
		if wait := p.every - time.Since(last); !last.IsZero() && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-p.stop:
				t.Stop()
				p.publish(ctx)
				return
			case <-t.C:
			}
		}
		p.publish(ctx)
		last = time.Now()
	}
}

// publish publishes the pending report, if any, while the call holds its lease. A
// report that cannot be published is dropped with a log line: progress is for people
// and liveness, the result does not depend on it. Each publication also tells
// JetStream the call is alive (InProgress).
func (p *progressPublisher) publish(ctx context.Context) {
	p.mu.Lock()
	tp := p.pending
	p.pending = nil
	p.mu.Unlock()
	if tp == nil {
		return
	}
	if !p.lv.valid() {
		p.log().Debug("progress not published: the executor's lease ran out", "seq", tp.Seq)
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := p.w.bus.PublishEvent(pctx, events.ToolProgressEvent(p.w.source, *tp)); err != nil {
		p.log().Warn("progress not published", "seq", tp.Seq, "error", err)
		return
	}
	_ = p.msg.InProgress() // best effort: the periodic heartbeat also runs
}
