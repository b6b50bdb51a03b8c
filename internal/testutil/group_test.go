package testutil

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// Stop cancels and waits for every goroutine started under a name, and only those.
func TestGroupStop(t *testing.T) {
	g := NewGroup(t, context.Background())
	var stopped atomic.Int32
	block := func(ctx context.Context) error { <-ctx.Done(); stopped.Add(1); return ctx.Err() }
	g.Go("a", block)
	g.Go("a", block)
	g.Go("b", block)
	g.Stop("a")
	if n := stopped.Load(); n != 2 {
		t.Fatalf("%d goroutines stopped by Stop(a), want 2", n)
	}
	g.StopAll()
	if n := stopped.Load(); n != 3 {
		t.Fatalf("%d goroutines stopped after StopAll, want 3", n)
	}
}

// A goroutine that fails before it is stopped fails the test.
func TestGroupReportsErrors(t *testing.T) {
	ft := &fakeT{TB: t}
	g := &Group{t: ft, ctx: context.Background(), stops: map[string][]func(){}}
	g.Go("w", func(context.Context) error { return errors.New("boom") })
	deadline := time.Now().Add(10 * time.Second)
	for !ft.failed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the error of a running goroutine was not reported")
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.Stop("w")
}

type fakeT struct {
	testing.TB
	failed atomic.Bool
}

func (f *fakeT) Errorf(string, ...any) { f.failed.Store(true) }
