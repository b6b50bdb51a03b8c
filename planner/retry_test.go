package planner

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header map[string]string
		want   time.Duration
		ok     bool
	}{
		{"none", nil, 0, false},
		{"seconds", map[string]string{"Retry-After": "7"}, 7 * time.Second, true},
		{"fractional seconds", map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond, true},
		{"zero", map[string]string{"Retry-After": "0"}, 0, true},
		{"http date", map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second, true},
		{"http date in the past", map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, 0, true},
		{"milliseconds win", map[string]string{"Retry-After-Ms": "250", "Retry-After": "9"}, 250 * time.Millisecond, true},
		{"bad milliseconds fall back", map[string]string{"Retry-After-Ms": "soon", "Retry-After": "2"}, 2 * time.Second, true},
		{"negative", map[string]string{"Retry-After": "-3"}, 0, false},
		{"garbage", map[string]string{"Retry-After": "tomorrow-ish"}, 0, false},
		{"NaN", map[string]string{"Retry-After": "NaN"}, 0, false},
		{"huge saturates", map[string]string{"Retry-After": "1e300"}, time.Duration(1<<63 - 1), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			got, ok := retryAfter(h, now)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("retryAfter = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
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
			err := p.do(ctx, nil, func(context.Context) error {
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
	err := p.do(context.Background(), nil, func(ctx context.Context) error {
		calls++
		if calls == 1 {
			<-ctx.Done() // the first attempt hangs until its own timeout
			return transportError("p", ctx.Err(), false)
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
		done <- p.do(ctx, nil, func(context.Context) error {
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
