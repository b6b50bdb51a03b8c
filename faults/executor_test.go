package faults_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// TestFaultExecutorKill kills -9 an executor process while it runs three calls of the
// append tool (3 s each, then a side effect). The calls are redelivered to a new
// executor after the ack wait; it takes over the dead executor's claims and runs them
// with the same idempotency keys: the side-effect file holds exactly one line per call,
// from exec-b at attempt 2, the stream exactly one tool.finished per call, and the step
// completes. It runs in plain `go test` too (about 15 s), so CI exercises a real crash.
func TestFaultExecutorKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	start := time.Now()
	e := newEnv(t, 1)
	file := filepath.Join(e.dir, "side-effects")
	e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=append:3x1:3000-3000")
	e.toolbusRole("injector", "injector-1")
	a := e.faultbusRole("executor", "exec-a", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_CONCURRENCY=8", "TOOLBUS_FAULT_APPEND_FILE="+file)
	e.waitReady([]string{"append"}, "planner", "injector", "executor")
	runs := []string{"kill-exec"}
	e.submit(runs)

	// The three calls are in exec-a's hands (delivered, claimed by exec-a, not
	// acknowledged) and none has finished: kill it mid-call.
	claims, err := e.bus.JS.KeyValue(e.ctx, store.BucketClaims)
	if err != nil {
		t.Fatal(err)
	}
	e.eventually("3 calls claimed and in flight on exec-a", 30*time.Second, func() error {
		if n := e.count(events.FilterToolFinished); n > 0 {
			t.Fatalf("%d results before the kill: the calls finished too early", n)
		}
		ci, err := e.consumerInfo(events.ToolConsumer("append"))
		if err != nil {
			return err
		}
		if ci.NumAckPending != 3 {
			return fmt.Errorf("%d calls in flight", ci.NumAckPending)
		}
		for i := 0; i < 3; i++ {
			ctx, cancel := e.op()
			entry, err := claims.Get(ctx, store.ClaimKey("append", "kill-exec", 0, fmt.Sprintf("c%d", i)))
			cancel()
			if err != nil {
				return fmt.Errorf("call c%d not claimed yet: %w", i, err)
			}
			if !strings.Contains(string(entry.Value()), `"exec-a"`) {
				return fmt.Errorf("call c%d claimed by %s", i, entry.Value())
			}
		}
		return nil
	})
	a.kill()
	if sig, ok := a.signaled(); !ok || sig != syscall.SIGKILL {
		t.Fatalf("exec-a did not die of SIGKILL: %v", a.cmd.ProcessState)
	}
	if n := e.count(events.FilterToolFinished); n != 0 {
		t.Fatalf("%d results were stored before the kill", n)
	}
	killedAt := time.Now()
	e.faultbusRole("executor", "exec-b", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_CONCURRENCY=8", "TOOLBUS_FAULT_APPEND_FILE="+file)
	e.waitCompleted(runs, 60*time.Second)
	recovered := time.Since(killedAt)

	tl := e.tally()
	st := e.checkRuns(tl, runs, 1, 3)
	for _, rt := range tl {
		for k, fs := range rt.finished {
			for _, f := range fs {
				if f.ToolResult.Executor != "exec-b" || f.ToolResult.Attempt != 2 {
					t.Errorf("call %v: finished on %s at attempt %d, want exec-b attempt 2", k, f.ToolResult.Executor, f.ToolResult.Attempt)
				}
			}
		}
	}
	checkSideEffects(t, file, runs, 1, 3)
	for key, lines := range scanLines(t, file) {
		if f := strings.Fields(lines[0]); len(f) < 3 || f[1] != "exec-b" || f[2] != "2" {
			t.Errorf("side effect of %s: %q, want exec-b at attempt 2", key, lines)
		}
	}
	if !strings.Contains(a.logText(), "executor serving") {
		t.Errorf("exec-a log does not show it served:\n%s", a.logTail(10))
	}
	t.Logf("%s; recovered %v after the kill; test took %v", st, recovered.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
