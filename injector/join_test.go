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
	in, err := New(bus, Config{WorkerConfig: events.WorkerConfig{Instance: name,
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
	go func() { errs <- in.steps.submit(id, receive(0), write) }()
	eventstest.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(batches) == 0 {
			return errors.New("first write not started")
		}
		return nil
	})
	for i := 1; i <= queued; i++ {
		go func() { errs <- in.steps.submit(id, receive(i), write) }()
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
	if err := in.steps.submit(stepID("run-1", 0), receive(0), fail); !errors.Is(err, boom) {
		t.Fatalf("submit: %v, want %v", err, boom)
	}
	if err := in.update(ctx, "run-1", 0, 3, receive(0)); err != nil {
		t.Fatal(err)
	}
	wantReceived(t, ctx, bus, "run-1", 0, 3, 0)
}
