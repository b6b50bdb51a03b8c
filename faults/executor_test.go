package faults_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
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
	e.waitClaimed("kill-exec", "exec-a", 3, func() error {
		_ = e.noResults()
		ci, err := e.consumerInfo(events.ToolConsumer("append"))
		if err != nil {
			return err
		}
		if ci.NumAckPending != 3 {
			return fmt.Errorf("%d calls in flight", ci.NumAckPending)
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
	checkTakenOver(t, file, runs, 1, 3, "exec-b")
	if !strings.Contains(a.logText(), "executor serving") {
		t.Errorf("exec-a log does not show it served:\n%s", a.logTail(10))
	}
	t.Logf("%s; recovered %v after the kill; test took %v", st, recovered.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
