package injector

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// The group commit of the injector (update, steps.submit, apply): results of one step
// join its state with compare-and-set on the history bucket of a real embedded
// JetStream. Each test leaves one call of the step unanswered, so the step never
// settles: what is tested is the join, not what follows it.

// joinBus is a bus on a fresh embedded server.
func joinBus(t *testing.T) (context.Context, *events.Bus) {
	t.Helper()
	return eventstest.Context(t, time.Minute), eventstest.Setup(t, events.Config{})
}

// joinInjector is an injector on bus (not running: the tests call its join directly).
func joinInjector(t *testing.T, bus *events.Bus, name string) *Injector {
	t.Helper()
	in, err := New(bus, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: name,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func receive(idx int) func(*store.StepState) bool {
	return func(st *store.StepState) bool { return st.Received.Set(idx) }
}

// wantReceived checks the stored join state: exactly the indexes of want are received.
// It returns the state's revision.
func wantReceived(t *testing.T, ctx context.Context, bus *events.Bus, run string, step, count int, want ...int) uint64 {
	t.Helper()
	st, rev, err := bus.Store().StepState(ctx, run, step)
	if err != nil {
		t.Fatal(err)
	}
	in := map[int]bool{}
	for _, i := range want {
		in[i] = true
	}
	for i := 0; i < count; i++ {
		if st.Received.Has(i) != in[i] {
			t.Errorf("index %d received: %v, want %v (stored: %d received)", i, st.Received.Has(i), in[i], st.Received.Count())
		}
	}
	return rev
}

// TestJoinConcurrentResults: results of one step handled at once each return only once
// their change is stored, and none is lost.
func TestJoinConcurrentResults(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	const count = 65 // the last call stays unanswered
	errs := make(chan error, count-1)
	var wg sync.WaitGroup
	for i := 0; i < count-1; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- in.update(ctx, "run-1", 0, count, receive(i))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	all := make([]int, count-1)
	for i := range all {
		all[i] = i
	}
	wantReceived(t, ctx, bus, "run-1", 0, count, all...)
}

// TestJoinDuplicates: a result joined twice changes nothing and writes nothing.
func TestJoinDuplicates(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	if err := in.update(ctx, "run-1", 0, 3, receive(1)); err != nil {
		t.Fatal(err)
	}
	rev := wantReceived(t, ctx, bus, "run-1", 0, 3, 1)
	for range 2 {
		if err := in.update(ctx, "run-1", 0, 3, receive(1)); err != nil {
			t.Fatal(err)
		}
	}
	if again := wantReceived(t, ctx, bus, "run-1", 0, 3, 1); again != rev {
		t.Errorf("duplicates wrote the join state: revision %d, want %d", again, rev)
	}
	// A duplicate reaching another injector (nothing cached there) writes nothing either.
	other := joinInjector(t, bus, "injector-2")
	if err := other.update(ctx, "run-1", 0, 3, receive(1)); err != nil {
		t.Fatal(err)
	}
	if again := wantReceived(t, ctx, bus, "run-1", 0, 3, 1); again != rev {
		t.Errorf("a duplicate on another injector wrote the join state: revision %d, want %d", again, rev)
	}
}

// TestJoinOutOfOrder: results join in any order; each is stored when its handler
// returns.
func TestJoinOutOfOrder(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	order := []int{4, 0, 3, 1}
	for n, idx := range order {
		if err := in.update(ctx, "run-1", 2, 6, receive(idx)); err != nil {
			t.Fatal(err)
		}
		wantReceived(t, ctx, bus, "run-1", 2, 6, order[:n+1]...)
	}
}

// TestJoinConflictingWrite: another injector writes the step behind this one's cached
// revision; the next write of this one fails its compare-and-set, reads the step again
// and applies its change on top: nothing of either is lost.
func TestJoinConflictingWrite(t *testing.T) {
	ctx, bus := joinBus(t)
	a, b := joinInjector(t, bus, "injector-a"), joinInjector(t, bus, "injector-b")
	if err := a.update(ctx, "run-1", 0, 5, receive(0)); err != nil {
		t.Fatal(err)
	}
	if err := b.update(ctx, "run-1", 0, 5, receive(1)); err != nil {
		t.Fatal(err)
	}
	// a's cached revision is now stale.
	if err := a.update(ctx, "run-1", 0, 5, receive(2)); err != nil {
		t.Fatal(err)
	}
	wantReceived(t, ctx, bus, "run-1", 0, 5, 0, 1, 2)

	// A writer outside any injector does the same.
	st, rev, err := bus.Store().StepState(ctx, "run-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	st.Waiting.Set(3)
	if _, err := bus.Store().PutStepState(ctx, st, rev); err != nil {
		t.Fatal(err)
	}
	if err := a.update(ctx, "run-1", 0, 5, func(st *store.StepState) bool { return st.Waiting.Set(3) }); err != nil {
		t.Fatal(err)
	}
	wantReceived(t, ctx, bus, "run-1", 0, 5, 0, 1, 2)
	// A result whose call count disagrees with the stored step is poison.
	if err := b.update(ctx, "run-1", 0, 6, receive(4)); !errors.Is(err, events.ErrPoison) {
		t.Errorf("call count 6 on a step of 5: %v, want ErrPoison", err)
	}
}

// TestJoinGroupsQueuedChanges: changes to a step that arrive while a write of it is in
// flight are written together in the next write, with one compare-and-set, and each of
// their handlers gets that write's outcome.
func TestJoinGroupsQueuedChanges(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	const run, step, count, queued = "run-1", 0, 10, 5
	id := stepID(run, step)
	release := make(chan struct{})
	var (
		mu      sync.Mutex
		batches []int
	)
	write := func(batch []func(*store.StepState) bool, cached *cachedStep) (*cachedStep, error) {
		mu.Lock()
		first := len(batches) == 0
		batches = append(batches, len(batch))
		mu.Unlock()
		if first {
			<-release
		}
		return in.apply(ctx, run, step, count, batch, cached)
	}
	errs := make(chan error, queued+1)
	go func() { errs <- in.steps.submit(id, receive(0), count, write) }()
	eventstest.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(batches) == 0 {
			return errors.New("first write not started")
		}
		return nil
	})
	for i := 1; i <= queued; i++ {
		go func() { errs <- in.steps.submit(id, receive(i), count, write) }()
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		in.steps.mu.Lock()
		defer in.steps.mu.Unlock()
		if n := len(in.steps.m[id].pending); n != queued {
			return errors.New("changes not queued yet")
		}
		return nil
	})
	close(release)
	for range queued + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if len(batches) != 2 || batches[0] != 1 || batches[1] != queued {
		t.Errorf("batches %v, want [1 %d]: the queued changes in one write", batches, queued)
	}
	// The queued changes were applied in one apply (one compare-and-set, as nobody else
	// writes the step); all six are stored.
	wantReceived(t, ctx, bus, run, step, count, 0, 1, 2, 3, 4, 5)
}

// TestJoinBatchFailure: when the write of a batch fails, every handler of the batch gets
// the error (each message is then redelivered), and the next change reads the step
// again.
func TestJoinBatchFailure(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	boom := errors.New("store down")
	fail := func([]func(*store.StepState) bool, *cachedStep) (*cachedStep, error) { return nil, boom }
	if err := in.steps.submit(stepID("run-1", 0), receive(0), 3, fail); !errors.Is(err, boom) {
		t.Fatalf("submit: %v, want %v", err, boom)
	}
	if err := in.update(ctx, "run-1", 0, 3, receive(0)); err != nil {
		t.Fatal(err)
	}
	wantReceived(t, ctx, bus, "run-1", 0, 3, 0)
}

// gatherSteps is a steps queue with window whose writes record their batch sizes and
// apply the batch to an in-memory join state of a step of count calls (what is tested
// is the queue: when it writes and what together, not the store).
func gatherSteps(window time.Duration, count int) (*steps, func() []int, func(batch []func(*store.StepState) bool, cached *cachedStep) (*cachedStep, error)) {
	s := newSteps(window)
	var (
		mu      sync.Mutex
		batches []int
	)
	write := func(batch []func(*store.StepState) bool, cached *cachedStep) (*cachedStep, error) {
		mu.Lock()
		batches = append(batches, len(batch))
		mu.Unlock()
		st := store.NewStepState("run-1", 0, count)
		if cached != nil {
			st = cached.st.Clone()
		}
		for _, op := range batch {
			op(st)
		}
		return &cachedStep{st: st, rev: 1}, nil
	}
	got := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), batches...)
	}
	return s, got, write
}

// TestJoinGathersAStep: the results of a step that come in wait for the others (the
// join window) and are written together with the one that completes the step, in one
// write; that one is not held: with a window of a minute, the step is written as soon as
// its last result comes.
func TestJoinGathersAStep(t *testing.T) {
	const count = 4
	s, batches, write := gatherSteps(time.Minute, count)
	id := stepID("run-1", 0)
	errs := make(chan error, count)
	for i := range count - 1 {
		go func() { errs <- s.submit(id, receive(i), count, write) }()
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if q := s.m[id]; q == nil || len(q.pending) != count-1 || q.wake == nil {
			return errors.New("the first results are not gathering yet")
		}
		return nil
	})
	if b := batches(); len(b) != 0 {
		t.Fatalf("written before the step's last result: batches %v", b)
	}
	go func() { errs <- s.submit(id, receive(count-1), count, write) }()
	deadline := time.After(30 * time.Second) // far below the window
	for range count {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("the results were held after the step's last one came (batches %v)", batches())
		}
	}
	if b := batches(); len(b) != 1 || b[0] != count {
		t.Errorf("batches %v, want [%d]: the whole step in one write", b, count)
	}
}

// TestJoinWindowEnds: a step whose last result does not come is written when the window
// ends, with what came; a step of one call never waits; a negative JoinWindow writes at
// once.
func TestJoinWindowEnds(t *testing.T) {
	const count = 4
	s, batches, write := gatherSteps(50*time.Millisecond, count)
	id := stepID("run-1", 0)
	errs := make(chan error, count-1)
	for i := range count - 1 {
		go func() { errs <- s.submit(id, receive(i), count, write) }()
	}
	deadline := time.After(30 * time.Second)
	for range count - 1 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("results of an incomplete step were held past the window (batches %v)", batches())
		}
	}
	sum := 0
	for _, n := range batches() {
		sum += n
	}
	if sum != count-1 {
		t.Errorf("batches %v, want the %d results written", batches(), count-1)
	}

	// One call: written at once, whatever the window.
	one, oneBatches, oneWrite := gatherSteps(time.Hour, 1)
	done := make(chan error, 1)
	go func() { done <- one.submit(stepID("run-2", 0), receive(0), 1, oneWrite) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("a step of one call waited for the window (batches %v)", oneBatches())
	}

	// JoinWindow < 0: no window.
	in, err := New(nil, Config{JoinWindow: -1})
	if err != nil {
		t.Fatal(err)
	}
	if in.steps.window != 0 {
		t.Errorf("JoinWindow -1: window %v, want none", in.steps.window)
	}
	if in, _ := New(nil, Config{}); in.steps.window != DefaultJoinWindow {
		t.Errorf("default window %v, want %v", in.steps.window, DefaultJoinWindow)
	}
}
