package consume

import "sync"

// workers runs handlers on at most limit goroutines, kept between messages, and hands
// each message to the goroutine that went idle last. Idle goroutines are parked with
// almost nothing on their stacks, so every garbage collection halves their stacks; a
// handler then grows its goroutine's stack back, copying it each time it doubles. The
// goroutine idle the shortest time has been through the fewest collections since its
// last handler: handing it the next message (last in, first out) keeps those copies to
// about one per collection for the goroutines in use, where a queue of idle goroutines
// (first in, first out: a channel's waiters) hands every message to the one shrunk the
// most (docs/performance.md, ninth round).
type workers struct {
	slots chan struct{} // a token per handler running or handed over: Go blocks when full
	mu    sync.Mutex
	idle  []chan func() // the idle goroutines' inboxes, the last one idled last
	wg    sync.WaitGroup
}

func newWorkers(limit int) *workers {
	return &workers{slots: make(chan struct{}, limit)}
}

// Go runs f on an idle goroutine, or a new one while fewer than the limit exist; it
// blocks while limit handlers run.
func (w *workers) Go(f func()) {
	w.slots <- struct{}{}
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		in := w.idle[n-1]
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		in <- f
		return
	}
	w.mu.Unlock()
	w.wg.Add(1)
	go w.run(f)
}

func (w *workers) run(f func()) {
	defer w.wg.Done()
	in := make(chan func(), 1)
	for f != nil {
		f()
		// Idle before the slot is free: a Go that takes the slot finds this goroutine.
		w.mu.Lock()
		w.idle = append(w.idle, in)
		w.mu.Unlock()
		<-w.slots
		f = <-in
	}
}

// Wait waits for the handlers running, then ends the idle goroutines. Go must not be
// called during or after it.
func (w *workers) Wait() {
	for range cap(w.slots) {
		w.slots <- struct{}{}
	}
	w.mu.Lock()
	for _, in := range w.idle {
		close(in)
	}
	w.idle = nil
	w.mu.Unlock()
	w.wg.Wait()
}
