package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
)

// longRunning registers one long-running tool (heartbeat hb, longest run max) and
// returns an executor for it.
func longRunning(t *testing.T, hb, max time.Duration, fn executor.Func) *executor.Executor {
	t.Helper()
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{
		Name: "long", Description: "a long-running tool", InputSchema: json.RawMessage(emptySchema),
		Timeout: max, HeartbeatTimeout: hb, Func: fn,
	}); err != nil {
		t.Fatal(err)
	}
	e, err := executor.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// reports collects what a sink receives.
type reports struct {
	mu  sync.Mutex
	got []executor.ProgressReport
}

func (r *reports) sink(p executor.ProgressReport) {
	r.mu.Lock()
	r.got = append(r.got, p)
	r.mu.Unlock()
}

func (r *reports) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// TestProgressKeepsLongRunningToolAlive: a tool that keeps reporting runs well past its
// heartbeat timeout and succeeds; every report reaches the sink.
func TestProgressKeepsLongRunningToolAlive(t *testing.T) {
	const hb = 500 * time.Millisecond
	ex := longRunning(t, hb, time.Minute, func(ctx context.Context, _ json.RawMessage) (any, error) {
		start := time.Now()
		n := 0
		for time.Since(start) < 4*hb { // four heartbeat timeouts
			n++
			if err := executor.Progress(ctx, float64(n), 0, "working"); err != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(hb / 20):
			}
		}
		return map[string]int{"reports": n}, nil
	})
	var r reports
	res := ex.Execute(executor.WithProgressSink(context.Background(), r.sink), toolbus.ToolCall{CallID: "c1", Tool: "long", Arguments: "{}"}, toolbus.Principal{})
	if res.Status != toolbus.StatusSucceeded {
		t.Fatalf("status %s (%+v), want succeeded: progress must keep a long-running tool alive", res.Status, res.Error)
	}
	if r.len() < 5 {
		t.Fatalf("the sink got %d reports", r.len())
	}
}

// TestLongRunningToolWithoutProgressTimesOut: a tool that stops reporting is timed out
// after its heartbeat timeout, long before its own timeout, and says so.
func TestLongRunningToolWithoutProgressTimesOut(t *testing.T) {
	const hb = 200 * time.Millisecond
	stopped := make(chan struct{})
	ex := longRunning(t, hb, 10*time.Minute, func(ctx context.Context, _ json.RawMessage) (any, error) {
		_ = executor.Progress(ctx, 1, 10, "started")
		<-ctx.Done() // then silence, until the executor gives up
		close(stopped)
		return nil, ctx.Err()
	})
	res := ex.Execute(context.Background(), toolbus.ToolCall{CallID: "c1", Tool: "long", Arguments: "{}"}, toolbus.Principal{})
	if res.Status != toolbus.StatusTimedOut || res.Code() != toolbus.CodeTimeout || !strings.Contains(res.Error.Message, "no progress for 200ms") {
		t.Fatalf("result %s %+v, want timed_out / timeout naming the heartbeat timeout", res.Status, res.Error)
	}
	select {
	case <-stopped: // the tool's context was cancelled
	case <-time.After(30 * time.Second):
		t.Fatal("the tool's context was not cancelled at the heartbeat timeout")
	}
}

// TestProgressNeverExtendsDeadline: reports do not carry a call past its context's
// deadline (the run's deadline).
func TestProgressNeverExtendsDeadline(t *testing.T) {
	ex := longRunning(t, time.Second, time.Hour, func(ctx context.Context, _ json.RawMessage) (any, error) {
		for ctx.Err() == nil {
			_ = executor.Progress(ctx, 1, 0, "")
			time.Sleep(10 * time.Millisecond)
		}
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	res := ex.Execute(ctx, toolbus.ToolCall{CallID: "c1", Tool: "long", Arguments: "{}"}, toolbus.Principal{})
	if res.Status != toolbus.StatusTimedOut || strings.Contains(res.Error.Message, "no progress") {
		t.Fatalf("result %s %+v, want timed_out at the deadline", res.Status, res.Error)
	}
}

// TestProgressOfNoRunningCall: a report outside a call, or after the call ended, is
// refused with ErrNotRunning and reaches no sink; bad values are refused too.
func TestProgressOfNoRunningCall(t *testing.T) {
	var kept context.Context
	ex := longRunning(t, time.Second, time.Minute, func(ctx context.Context, _ json.RawMessage) (any, error) {
		kept = ctx
		if err := executor.Progress(ctx, -1, 0, ""); !errors.Is(err, executor.ErrInvalidProgress) {
			return nil, errors.New("a negative report was not refused")
		}
		return "ok", executor.Progress(ctx, 1, 1, "done")
	})
	var r reports
	res := ex.Execute(executor.WithProgressSink(context.Background(), r.sink), toolbus.ToolCall{CallID: "c1", Tool: "long", Arguments: "{}"}, toolbus.Principal{})
	if res.Status != toolbus.StatusSucceeded {
		t.Fatalf("status %s %+v", res.Status, res.Error)
	}
	err := executor.Progress(kept, 2, 2, "late")
	if !errors.Is(err, executor.ErrNotRunning) || !strings.Contains(err.Error(), "already ended") {
		t.Fatalf("a report after the call returned: %v, want ErrNotRunning saying the call ended", err)
	}
	if err := executor.Progress(context.Background(), 1, 0, ""); !errors.Is(err, executor.ErrNotRunning) {
		t.Fatalf("a report outside a call: %v, want ErrNotRunning", err)
	}
	if n := r.len(); n != 1 {
		t.Fatalf("the sink got %d reports, want the 1 made while the call ran", n)
	}
}

// TestHeartbeatTimeoutValidated: a heartbeat timeout must be positive and below the
// tool's timeout (its longest run).
func TestHeartbeatTimeoutValidated(t *testing.T) {
	for _, tt := range []struct{ hb, timeout time.Duration }{
		{-time.Second, time.Minute}, {time.Minute, time.Minute}, {time.Second, 0},
	} {
		err := executor.NewRegistry().Register(executor.Tool{Name: "long", InputSchema: json.RawMessage(emptySchema),
			Timeout: tt.timeout, HeartbeatTimeout: tt.hb, Func: func(context.Context, json.RawMessage) (any, error) { return nil, nil }})
		if !errors.Is(err, executor.ErrInvalidTool) || !strings.Contains(err.Error(), "HeartbeatTimeout") {
			t.Errorf("heartbeat %s, timeout %s: %v, want ErrInvalidTool naming HeartbeatTimeout", tt.hb, tt.timeout, err)
		}
	}
}
