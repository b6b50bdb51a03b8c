package consume

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (w *workers) idleCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.idle)
}

// The goroutine that went idle last takes the next message, and no goroutine is started
// while one is idle: one handler at a time needs one goroutine, whatever the limit.
func TestWorkersHandTheNextMessageToTheLastIdle(t *testing.T) {
	w := newWorkers(8)
	// Three handlers at once, ending in the order a, b, c.
	release := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{}), "c": make(chan struct{})}
	var running atomic.Int32
	for _, name := range []string{"a", "b", "c"} {
		ch := release[name]
		w.Go(func() { running.Add(1); <-ch })
	}
	waitFor(t, "three handlers running", func() bool { return running.Load() == 3 })
	var order []chan func()
	for _, name := range []string{"a", "b", "c"} {
		close(release[name])
		waitFor(t, name+" idle", func() bool { return w.idleCount() == len(order)+1 })
		w.mu.Lock()
		order = append(order, w.idle[len(w.idle)-1])
		w.mu.Unlock()
	}
	hold := make(chan struct{})
	w.Go(func() { <-hold })
	w.mu.Lock()
	left := append([]chan func(){}, w.idle...)
	w.mu.Unlock()
	if len(left) != 2 || left[0] != order[0] || left[1] != order[1] {
		t.Fatalf("after a message, idle %v; want a's and b's goroutines (%v), c's took it", left, order[:2])
	}
	close(hold)
	waitFor(t, "c idle again", func() bool { return w.idleCount() == 3 })

	// One message at a time: no goroutine beyond the three.
	for range 100 {
		done := make(chan struct{})
		w.Go(func() { close(done) })
		<-done
		waitFor(t, "idle again", func() bool { return w.idleCount() == 3 })
	}
	w.Wait()
	if n := w.idleCount(); n != 0 {
		t.Fatalf("%d idle goroutines after Wait", n)
	}
}

// Go blocks while limit handlers run, and Wait returns once they are done, with every
// goroutine ended.
func TestWorkersLimitAndWait(t *testing.T) {
	const limit = 4
	w := newWorkers(limit)
	var running, peak atomic.Int32
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(limit)
	for range limit {
		w.Go(func() {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			started.Done()
			<-release
			running.Add(-1)
		})
	}
	started.Wait()
	blocked := make(chan struct{})
	var fifth atomic.Bool
	go func() {
		w.Go(func() { fifth.Store(true) })
		close(blocked)
	}()
	select {
	case <-blocked:
		t.Fatal("Go returned while the limit of handlers ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-blocked
	ended := make(chan struct{})
	go func() { w.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
	if !fifth.Load() || peak.Load() != limit || running.Load() != 0 {
		t.Fatalf("fifth ran %v, peak %d (limit %d), running %d", fifth.Load(), peak.Load(), limit, running.Load())
	}
	w.wg.Wait() // every goroutine ended: Wait closed the idle ones' inboxes
}
