package executor

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Done must hand out a closed channel, once, however the call ended before it was
// first asked for (a parent that ended, a deadline that passed, an earlier Err or
// cancel), and an open one that closes later otherwise.
func TestCallCtxDone(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name     string
		parent   context.Context
		deadline time.Duration
		before   func(c *callCtx)
		want     error
	}{
		{"parent ended", ended, time.Hour, nil, context.Canceled},
		{"deadline passed", context.Background(), -time.Second, nil, context.DeadlineExceeded},
		{"Err first", ended, time.Hour, func(c *callCtx) { _ = c.Err() }, context.Canceled},
		{"cancelled first", context.Background(), time.Hour, func(c *callCtx) { c.cancel(context.Canceled) }, context.Canceled},
		{"deadline later", context.Background(), 20 * time.Millisecond, nil, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &callCtx{parent: tt.parent, deadline: time.Now().Add(tt.deadline)}
			if tt.before != nil {
				tt.before(c)
			}
			done := c.Done() // panicked with "close of closed channel" when the parent had ended
			if again := c.Done(); again != done {
				t.Fatal("Done returned a different channel the second time")
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Done never closed")
			}
			if err := c.Err(); !errors.Is(err, tt.want) {
				t.Fatalf("Err() = %v, want %v", err, tt.want)
			}
			c.cancel(context.Canceled) // a late cancel changes nothing and does not panic
			if err := c.Err(); !errors.Is(err, tt.want) {
				t.Fatalf("Err() after a late cancel = %v, want %v", err, tt.want)
			}
		})
	}
}
