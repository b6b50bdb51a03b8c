package injector

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// Finished keeps results inline in the join state. As in join_test.go, each step keeps
// its last call unanswered, so it never settles: what is tested is the join.

// recordCalls records the assistant message of a step of n calls c0..c<n-1> of tool t.
func recordCalls(t *testing.T, ctx context.Context, bus *events.Bus, run string, step, n int) {
	t.Helper()
	calls := make([]toolbus.ToolCall, n)
	for i := range calls {
		calls[i] = toolbus.ToolCall{CallID: "c" + strconv.Itoa(i), Tool: "t"}
	}
	if _, _, err := bus.Store().PutAssistant(ctx, toolbus.ModelResponded{RunID: run, Step: step,
		Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}}); err != nil {
		t.Fatal(err)
	}
}

func finished(run string, step, idx, n int, content string) toolbus.ToolFinished {
	return toolbus.ToolFinished{RunID: run, Step: step, CallIndex: idx, CallCount: n,
		ToolResult: toolbus.ToolResult{CallID: "c" + strconv.Itoa(idx), Tool: "t", Status: toolbus.StatusSucceeded, Content: content}}
}

// hasResultKey reports whether call idx has a result under its own key.
func hasResultKey(t *testing.T, ctx context.Context, bus *events.Bus, run string, step, idx int) bool {
	t.Helper()
	kv, err := bus.JetStream().KeyValue(ctx, store.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kv.Get(ctx, run+"."+strconv.Itoa(step)+".r."+strconv.Itoa(idx))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// wantResults checks what the readers (Store.Step, and this injector's assemble of the
// stored state) find for each call.
func wantResults(t *testing.T, ctx context.Context, in *Injector, run string, step int, want map[int]string) {
	t.Helper()
	st, _, err := in.bus.Store().StepState(ctx, run, step)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, err := in.bus.Store().Step(ctx, run, step)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := in.assemble(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < st.CallCount; i++ {
		w, ok := want[i]
		for who, r := range map[string]*toolbus.ToolResult{"Step": rec.Results[i], "assemble": mine.Results[i]} {
			switch {
			case ok && (r == nil || r.Content != w):
				t.Errorf("%s: result %d = %+v, want %q", who, i, r, w)
			case !ok && r != nil:
				t.Errorf("%s: result %d = %+v, want none", who, i, r)
			}
		}
	}
}

// A result within the inline budget is stored in the join state only (no key of its
// own); one over InlineResultMax goes under its own key and is marked; a step joined in
// the previous layout (results under their own keys only) takes inline results beside
// its old ones. A duplicate changes nothing; a differing one is poison.
func TestFinishedInlineAndOverflow(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	const run, n = "run-1", 5
	recordCalls(t, ctx, bus, run, 0, n)
	big := strings.Repeat("z", store.InlineResultMax+1)
	for i, content := range map[int]string{0: "small 0", 1: big, 2: "small 2"} {
		if err := in.Finished(ctx, finished(run, 0, i, n, content)); err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
	}
	for i, want := range map[int]bool{0: false, 1: true, 2: false} {
		if got := hasResultKey(t, ctx, bus, run, 0, i); got != want {
			t.Errorf("result %d under its own key: %v, want %v", i, got, want)
		}
	}
	st, rev, err := bus.Store().StepState(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Results) != 2 || st.Overflowed() != 1 {
		t.Errorf("join state: %d inline, %d overflowed; want 2 and 1", len(st.Results), st.Overflowed())
	}
	want := map[int]string{0: "small 0", 1: big, 2: "small 2"}
	wantResults(t, ctx, in, run, 0, want)
	// Another injector (nothing cached) reads the overflowed result from its key.
	wantResults(t, ctx, joinInjector(t, bus, "injector-2"), run, 0, want)

	// Duplicates: the same result again writes nothing; a differing one is poison and
	// changes nothing, inline or not.
	if err := in.Finished(ctx, finished(run, 0, 0, n, "small 0")); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} {
		if err := in.Finished(ctx, finished(run, 0, i, n, "differs")); !errors.Is(err, events.ErrPoison) {
			t.Errorf("differing duplicate of %d: %v, want ErrPoison", i, err)
		}
	}
	if _, again, _ := bus.Store().StepState(ctx, run, 0); again != rev {
		t.Errorf("duplicates wrote the join state: revision %d, want %d", again, rev)
	}
	wantResults(t, ctx, in, run, 0, want)

	// An old-layout step: results 0 and 1 only under their own keys, the state marks them.
	recordCalls(t, ctx, bus, run, 1, n)
	old := store.NewStepState(run, 1, n)
	for i := range 2 {
		if _, _, err := bus.Store().PutResult(ctx, run, 1, i, finished(run, 1, i, n, "old "+strconv.Itoa(i)).ToolResult); err != nil {
			t.Fatal(err)
		}
		old.Received.Set(i)
	}
	if _, err := bus.Store().PutStepState(ctx, old, 0); err != nil {
		t.Fatal(err)
	}
	other := joinInjector(t, bus, "injector-3")
	if err := other.Finished(ctx, finished(run, 1, 2, n, "new 2")); err != nil {
		t.Fatal(err)
	}
	if err := other.Finished(ctx, finished(run, 1, 0, n, "old 0")); err != nil {
		t.Errorf("duplicate of an old-layout result: %v", err)
	}
	if err := other.Finished(ctx, finished(run, 1, 1, n, "differs")); !errors.Is(err, events.ErrPoison) {
		t.Errorf("differing duplicate of an old-layout result: %v, want ErrPoison", err)
	}
	wantResults(t, ctx, other, run, 1, map[int]string{0: "old 0", 1: "old 1", 2: "new 2"})
}

// Once the inline results fill the state's budget, further results go under their own
// keys (written before the mark) and the state stays within its budget.
func TestFinishedOverflowWhenFull(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	const run = "run-1"
	n := 2*store.InlineStateMax/store.InlineResultMax + 2
	recordCalls(t, ctx, bus, run, 0, n)
	want := map[int]string{}
	for i := 0; i < n-1; i++ {
		want[i] = strconv.Itoa(i) + strings.Repeat("y", store.InlineResultMax-200)
		if err := in.Finished(ctx, finished(run, 0, i, n, want[i])); err != nil {
			t.Fatal(err)
		}
	}
	st, _, err := bus.Store().StepState(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.InlineBytes() > bus.Store().InlineBudget() || len(st.Results) == 0 || st.Overflowed() == 0 {
		t.Fatalf("state: %d bytes inline (budget %d), %d inline, %d overflowed", st.InlineBytes(), bus.Store().InlineBudget(),
			len(st.Results), st.Overflowed())
	}
	for i := 0; i < n-1; i++ {
		_, inline := st.Results[i]
		if hasResultKey(t, ctx, bus, run, 0, i) == inline {
			t.Errorf("result %d: inline %v, and under its own key too / nowhere", i, inline)
		}
	}
	wantResults(t, ctx, in, run, 0, want)
	wantResults(t, ctx, joinInjector(t, bus, "injector-2"), run, 0, want)
}

// Any number of injectors join one step concurrently, each call's result reaching
// several of them, some with differing content and some too large to inline: for each
// call exactly one result stands, every handler that saw another one reports poison,
// and the readers return the one that stands.
func TestFinishedConcurrentInjectors(t *testing.T) {
	ctx, bus := joinBus(t)
	ins := []*Injector{joinInjector(t, bus, "injector-a"), joinInjector(t, bus, "injector-b"), joinInjector(t, bus, "injector-c")}
	const run, n = "run-1", 24
	recordCalls(t, ctx, bus, run, 0, n)
	big := strings.Repeat("b", store.InlineResultMax+1)
	// content of call i as injector k receives it
	content := func(i, k int) string {
		switch i % 4 {
		case 0:
			return "same " + strconv.Itoa(i) // a plain duplicate
		case 1:
			return "version " + strconv.Itoa(k) // differing duplicates, all inline
		case 2:
			if k == 0 {
				return big + strconv.Itoa(i) // one overflows, the others are inline
			}
			return "version " + strconv.Itoa(k)
		default:
			return big + strconv.Itoa(k) // differing and all overflowing
		}
	}
	type outcome struct {
		i, k int
		err  error
	}
	out := make(chan outcome, n*len(ins))
	var wg sync.WaitGroup
	for i := 0; i < n-1; i++ {
		for k, in := range ins {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out <- outcome{i, k, in.Finished(ctx, finished(run, 0, i, n, content(i, k)))}
			}()
		}
	}
	wg.Wait()
	close(out)
	accepted := map[int][]int{}
	for o := range out {
		switch {
		case o.err == nil:
			accepted[o.i] = append(accepted[o.i], o.k)
		case !errors.Is(o.err, events.ErrPoison):
			t.Fatalf("call %d on injector %d: %v", o.i, o.k, o.err)
		}
	}
	want := map[int]string{}
	for i := 0; i < n-1; i++ {
		ks := accepted[i]
		if i%4 == 0 {
			if len(ks) != len(ins) {
				t.Errorf("call %d: plain duplicates accepted by %v, want all", i, ks)
			}
		} else if len(ks) != 1 {
			t.Errorf("call %d: differing results accepted by %v, want exactly one (the others poison)", i, ks)
			continue
		}
		want[i] = content(i, ks[0])
	}
	for _, in := range ins {
		wantResults(t, ctx, in, run, 0, want)
	}
}

// A crash between writing a result under its own key and marking it: a redelivery of
// the same result marks it (nothing lost); when a differing small result comes first
// instead, it is joined inline and stands (the key was never marked, so it was never
// the call's result), and the readers ignore the unmarked key.
func TestFinishedAfterCrashBeforeMark(t *testing.T) {
	ctx, bus := joinBus(t)
	in := joinInjector(t, bus, "injector-1")
	const run, n = "run-1", 3
	recordCalls(t, ctx, bus, run, 0, n)
	big := strings.Repeat("k", store.InlineResultMax+1)
	for i, c := range []string{big, big} {
		if _, _, err := bus.Store().PutResult(ctx, run, 0, i, finished(run, 0, i, n, c).ToolResult); err != nil {
			t.Fatal(err)
		}
	}
	if err := in.Finished(ctx, finished(run, 0, 0, n, big)); err != nil {
		t.Fatal(err)
	}
	if err := in.Finished(ctx, finished(run, 0, 1, n, "small")); err != nil {
		t.Fatal(err)
	}
	wantResults(t, ctx, in, run, 0, map[int]string{0: big, 1: "small"})
	if err := in.Finished(ctx, finished(run, 0, 1, n, big)); !errors.Is(err, events.ErrPoison) {
		t.Errorf("the crashed writer's redelivered result: %v, want ErrPoison (the joined one stands)", err)
	}
	wantResults(t, ctx, joinInjector(t, bus, "injector-2"), run, 0, map[int]string{0: big, 1: "small"})
}
