package planner

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// sleeps records the waits of a RetryPolicy instead of waiting.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) waits() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// fastRetry is a policy with a tiny backoff whose waits are recorded, not slept.
func fastRetry(attempts int, s *sleeps) RetryPolicy {
	return RetryPolicy{MaxAttempts: attempts, BaseDelay: time.Microsecond, MaxDelay: time.Minute, Sleep: s.sleep}
}

func TestBackoffIsCappedAndJittered(t *testing.T) {
	p := RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}.withDefaults()
	for attempt := 1; attempt <= 70; attempt++ {
		want := min(100*time.Millisecond<<min(attempt-1, 20), time.Second)
		for range 20 {
			d := p.backoff(attempt)
			if d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
}

func TestRetryPolicy(t *testing.T) {
	retryable := func(after time.Duration) error {
		return &ProviderError{Provider: "p", Status: 503, Retryable: true, RetryAfter: after}
	}
	tests := []struct {
		name      string
		errs      []error // the errors of successive attempts; nil succeeds
		attempts  int
		ctx       func() (context.Context, context.CancelFunc)
		wantCalls int
		wantWaits []time.Duration // exact waits (only checked when set)
		wantErr   string
		permanent bool
	}{
		{name: "success first", errs: []error{nil}, attempts: 3, wantCalls: 1},
		{name: "retry after then success", errs: []error{retryable(3 * time.Second), nil}, attempts: 3, wantCalls: 2,
			wantWaits: []time.Duration{3 * time.Second}},
		{name: "gives up after max attempts", errs: []error{retryable(0), retryable(0), retryable(0), nil}, attempts: 3,
			wantCalls: 3, wantErr: "giving up after 3 attempts"},
		{name: "not retryable stops and is permanent", errs: []error{&ProviderError{Provider: "p", Status: 400}, nil}, attempts: 3,
			wantCalls: 1, wantErr: "400", permanent: true},
		{name: "other errors stop as they are", errs: []error{errors.New("boom"), nil}, attempts: 3, wantCalls: 1, wantErr: "boom"},
		{name: "permanent stops", errs: []error{Permanent(errors.New("no")), nil}, attempts: 3, wantCalls: 1, permanent: true, wantErr: "no"},
		{name: "retry after above the cap gives up now", errs: []error{retryable(2 * time.Hour), nil}, attempts: 3,
			wantCalls: 1, wantErr: "more than the 1m0s cap"},
		{name: "wait past the deadline gives up now", errs: []error{retryable(50 * time.Second), nil}, attempts: 3,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 10*time.Second)
			}, wantCalls: 1, wantErr: "no time left"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s sleeps
			p := fastRetry(tt.attempts, &s)
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			calls := 0
			err := p.Do(ctx, nil, func(context.Context) error {
				e := tt.errs[calls]
				calls++
				return e
			})
			if calls != tt.wantCalls {
				t.Fatalf("calls = %d, want %d", calls, tt.wantCalls)
			}
			if tt.wantErr == "" && err != nil {
				t.Fatalf("err = %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if errors.Is(err, ErrPermanent) != tt.permanent {
				t.Fatalf("permanent = %v, want %v (%v)", errors.Is(err, ErrPermanent), tt.permanent, err)
			}
			if tt.wantWaits != nil {
				got := s.waits()
				if len(got) != len(tt.wantWaits) {
					t.Fatalf("waits %v, want %v", got, tt.wantWaits)
				}
				for i := range got {
					if got[i] != tt.wantWaits[i] {
						t.Fatalf("waits %v, want %v", got, tt.wantWaits)
					}
				}
			}
			if len(s.waits()) != max(calls-1, 0) && tt.wantErr == "" {
				t.Fatalf("%d waits for %d calls", len(s.waits()), calls)
			}
		})
	}
}

func TestRetryPolicyAttemptTimeoutIsRetried(t *testing.T) {
	var s sleeps
	p := fastRetry(3, &s)
	p.AttemptTimeout = time.Millisecond
	calls := 0
	err := p.Do(context.Background(), nil, func(ctx context.Context) error {
		calls++
		if calls == 1 {
			<-ctx.Done() // the first attempt hangs until its own timeout
			return &ProviderError{Provider: "p", Message: "timed out", Retryable: true, Err: ctx.Err()}
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("err = %v after %d calls, want success on the second", err, calls)
	}
}

func TestRetryPolicyStopsWhenTheCallerGivesUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := RetryPolicy{MaxAttempts: 5, BaseDelay: time.Hour, MaxDelay: time.Hour} // real sleep: must end on cancel
	calls := 0
	done := make(chan error, 1)
	go func() {
		done <- p.Do(ctx, nil, func(context.Context) error {
			calls++
			return &ProviderError{Provider: "p", Status: 500, Retryable: true}
		})
	}()
	cancel()
	err := <-done
	if err == nil || errors.Is(err, ErrPermanent) {
		t.Fatalf("err = %v, want the transient provider error", err)
	}
	if calls > 1 {
		t.Fatalf("%d calls after cancel", calls)
	}
}
