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
// append tool (3 s each, 10 s when exec-b starts beside, then a side effect). The calls are redelivered to another
// executor after the ack wait; it takes over the dead executor's claims and runs them
// with the same idempotency keys: the side-effect file holds exactly one line per call,
// from exec-b at attempt 2, the stream exactly one tool.finished per call, and the step
// completes. exec-b starts either after the kill, or before it with its queue idle long
// enough to park (300 ms): redeliveries ring no doorbell, so it must keep pulling while
// exec-a's calls are unacknowledged. It runs in plain `go test` too (about 15 s a case),
// so CI exercises a real crash.
func TestFaultExecutorKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tc := range []struct {
		name string
		// beside: exec-b is started before the kill, its queue idle and allowed to park.
		beside bool
	}{
		{"new executor after the kill", false},
		{"idle executor beside", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			e := newEnv(t, 1)
			file := filepath.Join(e.dir, "side-effects")
			// Beside, exec-b starts while the calls run: on a busy machine that took more
			// than 3 s, and the calls had finished before the kill.
			ms := map[bool]string{false: "3000", true: "10000"}[tc.beside]
			e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=append:3x1:"+ms+"-"+ms)
			e.toolbusRole("injector", "injector-1")
			a := e.faultbusRole("executor", "exec-a", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_CONCURRENCY=8", "TOOLBUS_FAULT_APPEND_FILE="+file)
			e.waitReady([]string{"append"}, "planner", "injector", "executor")
			run := "kill-exec-" + map[bool]string{false: "after", true: "beside"}[tc.beside]
			runs := []string{run}
			e.submit(runs)

			// The three calls are in exec-a's hands (delivered, claimed by exec-a, not
			// acknowledged) and none has finished: kill it mid-call.
			inFlight := func() error {
				_ = e.noResults()
				ci, err := e.consumerInfo(events.ToolConsumer("append"))
				if err != nil {
					return err
				}
				if ci.NumAckPending != 3 {
					return fmt.Errorf("%d calls in flight", ci.NumAckPending)
				}
				return nil
			}
			e.waitClaimed(run, "exec-a", 3, inFlight)
			startB := func() *proc {
				return e.faultbusRole("executor", "exec-b", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_CONCURRENCY=8",
					"TOOLBUS_FAULT_APPEND_FILE="+file, "TOOLBUS_EXECUTOR_PARK_AFTER=300ms")
			}
			if tc.beside {
				b := startB()
				// exec-b serves, with nothing for it: past its ParkAfter many times over
				// before the kill (the calls take 10 s).
				e.eventually("exec-b serving", 30*time.Second, func() error {
					if !strings.Contains(b.logText(), "executor serving") {
						return fmt.Errorf("exec-b log: %s", b.logTail(3))
					}
					return nil
				})
				time.Sleep(time.Second)
				if err := inFlight(); err != nil {
					t.Fatalf("before the kill: %v", err)
				}
			}
			a.kill()
			if sig, ok := a.signaled(); !ok || sig != syscall.SIGKILL {
				t.Fatalf("exec-a did not die of SIGKILL: %v", a.cmd.ProcessState)
			}
			if n := e.count(events.FilterToolFinished); n != 0 {
				t.Fatalf("%d results were stored before the kill", n)
			}
			killedAt := time.Now()
			if !tc.beside {
				startB()
			}
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
		})
	}
}
