package testutil

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// Group runs a test's long-lived goroutines (workers, watchers) under names, so a test
// can stop one (a crash, a restart) and every one is stopped, and waited for, when the
// test ends. A goroutine that returns an error before it is stopped fails the test.
type Group struct {
	t     testing.TB
	ctx   context.Context
	mu    sync.Mutex
	stops map[string][]func()
}

// NewGroup returns a Group whose goroutines run under ctx; it stops them all at the end
// of the test.
func NewGroup(t testing.TB, ctx context.Context) *Group {
	g := &Group{t: t, ctx: ctx, stops: map[string][]func(){}}
	t.Cleanup(g.StopAll)
	return g
}

// Go runs run under name until Stop(name), StopAll or the end of the test.
func (g *Group) Go(name string, run func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(g.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil && ctx.Err() == nil {
			g.t.Errorf("%s: %v", name, err)
		}
	}()
	g.mu.Lock()
	g.stops[name] = append(g.stops[name], func() { cancel(); <-done })
	g.mu.Unlock()
}

// Stop stops the goroutines started under name and waits for them to return.
func (g *Group) Stop(name string) {
	g.mu.Lock()
	fs := g.stops[name]
	delete(g.stops, name)
	g.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// StopAll stops every goroutine of the group and waits for them to return.
func (g *Group) StopAll() {
	g.mu.Lock()
	names := make([]string, 0, len(g.stops))
	for n := range g.stops {
		names = append(names, n)
	}
	g.mu.Unlock()
	for _, n := range names {
		g.Stop(n)
	}
}

// Logger is the logger of the workers a test starts: silent, or debug lines on stderr
// when TOOLBUS_TEST_LOG is set (to read what a failing test's workers did).
func Logger() *slog.Logger {
	if os.Getenv("TOOLBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Must returns what a constructor built and panics on its error: a test that
// configures something out of range fails there (the constructors' refusals are tested
// in their own packages).
func Must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
