package faults_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// TestFaultHandoverWithinHeartbeat: the append tool is long-running with a 2 s
// heartbeat timeout (it reports progress while it waits 4 s) and the executors ask for
// an ack wait of 10 minutes; the instance TTL is 2 s. exec-a dies mid-call (kill -9) or
// is paused (SIGSTOP, resumed once the call finished). Another executor, exec-b, already
// up, finishes the call, with the side effect done once (by exec-b, attempt 2): the
// call's queue redelivers it one lease after exec-a's last InProgress (its AckWait is
// capped at the TTL, workerconfig.QueueAckWait), not one ack wait later. No elapsed time is
// asserted: the wait for the result ends at 60 s, ten times less than the ack wait the
// executors asked for and far more than the few seconds a lease takes, so a busy
// machine does not fail it and an ack wait that is not capped does (before the cap the
// call finished 35 s after the kill, with the default ack wait of 30 s). The paused
// exec-a, resumed with its lease lost, neither does the side effect again nor
// publishes a result.
func TestFaultHandoverWithinHeartbeat(t *testing.T) {
	suite(t)
	for _, tc := range []struct {
		name  string
		fault func(a *proc)
	}{
		{"kill -9", func(a *proc) { a.kill() }},
		{"SIGSTOP", func(a *proc) {
			if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1)
			file := filepath.Join(e.dir, "side-effects")
			exec := []string{"TOOLBUS_FAULT_APPEND_FILE=" + file, "TOOLBUS_FAULT_APPEND_HEARTBEAT=2s", "TOOLBUS_ACK_WAIT=10m"}
			e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=append:1x1:4000-4000")
			e.toolbusRole("injector", "injector-1")
			a := e.faultbusRole("executor", "exec-a", exec...)
			e.waitReady([]string{"append"}, "planner", "injector", "executor")
			run := map[string]string{"kill -9": "handover-kill", "SIGSTOP": "handover-stop"}[tc.name]
			e.submit([]string{run})
			e.waitClaimed(run, "exec-a", 1, e.noResults)
			b := e.faultbusRole("executor", "exec-b", exec...)
			e.eventually("exec-b serving", 30*time.Second, func() error {
				if !strings.Contains(b.logText(), "executor serving") {
					return fmt.Errorf("exec-b log: %s", b.logTail(3))
				}
				return nil
			})
			if err := e.noResults(); err != nil {
				t.Fatal(err)
			}
			tc.fault(a)
			at := time.Now()
			e.eventually("the call finished", 60*time.Second, func() error {
				if n := e.count(events.FilterToolFinished); n != 1 {
					return fmt.Errorf("%d results", n)
				}
				return nil
			})
			t.Logf("%s: call finished by another executor %v after the fault", tc.name, time.Since(at).Round(10*time.Millisecond))
			info, err := e.consumerInfo(events.ToolConsumer("append"))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := info.Config.AckWait, workerconfig.QueueAckWait(10*time.Minute, e.cfg.InstanceTTL); got != want {
				t.Errorf("the queue of append waits %v for an ack, want %v (capped at the instance TTL)", got, want)
			}
			if tc.name == "SIGSTOP" {
				if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				// exec-a resumes with its lease lost: give it time to do what it would.
				e.eventually("exec-a logs its lease lost", 30*time.Second, func() error {
					if !strings.Contains(a.logText(), "lease lost") {
						return fmt.Errorf("no lease-lost line in exec-a's log:\n%s", a.logTail(10))
					}
					return nil
				})
				time.Sleep(2 * time.Second) // the fault's aftermath: a late side effect would come now
			}
			e.waitCompleted([]string{run}, 60*time.Second)
			tl := e.tally()
			e.checkRuns(tl, []string{run}, 1, 1)
			checkTakenOver(t, file, []string{run}, 1, 1, "exec-b")
		})
	}
}
