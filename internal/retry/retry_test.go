package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	cases := []struct {
		name   string
		p      Policy
		want   []time.Duration // attempts 1, 2, ...
		jitter bool
	}{
		{"doubles to the cap", Policy{Base: 250 * time.Millisecond, Max: 4 * time.Second},
			[]time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}, false},
		{"cap below base", Policy{Base: time.Second, Max: 100 * time.Millisecond},
			[]time.Duration{100 * time.Millisecond, 100 * time.Millisecond}, false},
		{"no cap saturates", Policy{Base: time.Hour},
			[]time.Duration{time.Hour, 2 * time.Hour}, false},
		{"jitter in upper half", Policy{Base: 100 * time.Millisecond, Max: time.Second, Jitter: true},
			[]time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i, want := range c.want {
				for range 50 {
					got := c.p.Backoff(i + 1)
					if !c.jitter && got != want || c.jitter && (got < want/2 || got > want) {
						t.Fatalf("Backoff(%d) = %v, want %v (jitter %v)", i+1, got, want, c.jitter)
					}
				}
			}
		})
	}
	if d := (Policy{Base: time.Second}).Backoff(200); d <= 0 {
		t.Fatalf("Backoff(200) = %v: overflowed", d)
	}
}

// recorder counts the calls of an operation and records the waits between them.
type recorder struct {
	calls int
	waits []time.Duration
}

func (r *recorder) sleep(ctx context.Context, d time.Duration) error {
	r.waits = append(r.waits, d)
	return ctx.Err()
}

func TestDo(t *testing.T) {
	errBoom := errors.New("boom")
	errFatal := errors.New("fatal")
	cases := []struct {
		name      string
		p         Policy
		failures  int   // op fails this many times, then succeeds
		fail      error // what op returns on a failure
		wantErr   error
		wantCalls int
		wantWaits []time.Duration
	}{
		{"first try", Policy{Attempts: 3, Base: time.Second}, 0, errBoom, nil, 1, nil},
		{"succeeds on the third", Policy{Attempts: 3, Base: time.Second}, 2, errBoom, nil, 3,
			[]time.Duration{time.Second, 2 * time.Second}},
		{"attempts run out", Policy{Attempts: 3, Base: time.Second, Max: 1500 * time.Millisecond}, 10, errBoom, errBoom, 3,
			[]time.Duration{time.Second, 1500 * time.Millisecond}},
		{"OnError stops", Policy{Base: time.Second, OnError: func(_ int, err error, w time.Duration) (time.Duration, error) {
			if errors.Is(err, errFatal) {
				return 0, fmt.Errorf("wrapped: %w", err)
			}
			return w, nil
		}}, 10, errFatal, errFatal, 1, nil},
		{"OnError sets the wait", Policy{Attempts: 3, Base: time.Second, OnError: func(n int, _ error, _ time.Duration) (time.Duration, error) {
			return time.Duration(n) * time.Minute, nil
		}}, 10, errBoom, errBoom, 3, []time.Duration{time.Minute, 2 * time.Minute}},
		{"OnError sees the last failure", Policy{Attempts: 2, Base: time.Second, OnError: func(n int, err error, w time.Duration) (time.Duration, error) {
			if n >= 2 {
				return 0, fmt.Errorf("giving up after %d attempts: %w", n, err)
			}
			return w, nil
		}}, 10, errBoom, errBoom, 2, []time.Duration{time.Second}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r recorder
			c.p.Sleep = r.sleep
			err := Do(context.Background(), c.p, func(context.Context) error {
				r.calls++
				if r.calls <= c.failures {
					return c.fail
				}
				return nil
			})
			if !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, c.wantErr)
			}
			if r.calls != c.wantCalls || fmt.Sprint(r.waits) != fmt.Sprint(c.wantWaits) {
				t.Fatalf("%d calls, waits %v; want %d, %v", r.calls, r.waits, c.wantCalls, c.wantWaits)
			}
		})
	}
}

// TestDoForBound: no attempt starts once For has passed since the first failure.
func TestDoForBound(t *testing.T) {
	calls := 0
	err := Do(context.Background(), Policy{For: time.Nanosecond, Base: time.Millisecond}, func(context.Context) error {
		calls++
		for start := time.Now(); time.Since(start) < time.Microsecond; {
			// let For pass before Do looks at the clock
		}
		return errors.New("down")
	})
	if err == nil || calls != 1 {
		t.Fatalf("err %v after %d calls, want an error after one call", err, calls)
	}
}

// TestDoContextEnds: a wait ends with the context and Do returns op's last error.
func TestDoContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	errDown := errors.New("down")
	done := make(chan error, 1)
	calls := 0
	go func() {
		done <- Do(ctx, Policy{Base: time.Hour}, func(context.Context) error { calls++; return errDown })
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, errDown) || calls != 1 {
			t.Fatalf("err %v after %d calls, want %v after one", err, calls, errDown)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Do did not return when its context ended")
	}
}
