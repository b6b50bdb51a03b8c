package faults_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// The fencing tests cut a live executor off mid-call, by a TCP proxy between it and the
// server or by SIGSTOP, for longer than its lease, while another executor is up. The
// append tool is cooperative (it waits on its context and checks CallInfo.LeaseValid
// before its side effect). Before the lease, the cut-off executor kept running its tool
// while the other took the claim over: the side effect happened twice. Now the cut-off
// executor stops the tool at its lease deadline, before anyone may take over, so each
// call has exactly one side effect (from the executor that took it over, attempt 2) and
// one result, and the run completes.

// fenceCase starts a planner (two append calls of 5 s), an injector and executor exec-a
// (through proxy when given), waits until exec-a has claimed both calls, starts exec-b,
// and returns exec-a and the side-effect file.
func fenceCase(t *testing.T, e *env, run string, viaProxy bool) (a *proc, proxy *tcpProxy, file string) {
	t.Helper()
	file = filepath.Join(e.dir, "side-effects")
	e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=append:2x1:5000-5000")
	e.toolbusRole("injector", "injector-1")
	extra := []string{"TOOLBUS_ACK_WAIT=2s", "TOOLBUS_CONCURRENCY=8", "TOOLBUS_FAULT_APPEND_FILE=" + file}
	if viaProxy {
		proxy = newTCPProxy(t, strings.TrimPrefix(e.nodes[0].url(), "nats://"))
		extra = append(extra, "TOOLBUS_NATS_URL="+proxy.url()) // later assignments win
	}
	a = e.faultbusRole("executor", "exec-a", extra...)
	e.waitReady([]string{"append"}, "planner", "injector", "executor")
	e.submit([]string{run})
	e.waitClaimed(run, "exec-a", 2, e.noResults)
	e.faultbusRole("executor", "exec-b", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_CONCURRENCY=8", "TOOLBUS_FAULT_APPEND_FILE="+file)
	return a, proxy, file
}

// checkFenced: one result and one side effect per call, each by exec-b at attempt 2.
func checkFenced(t *testing.T, e *env, run, file string) {
	t.Helper()
	e.waitCompleted([]string{run}, 90*time.Second)
	tl := e.tally()
	e.checkRuns(tl, []string{run}, 1, 2)
	checkTakenOver(t, file, []string{run}, 1, 2, "exec-b")
}

// TestFaultPartitionExecutor cuts exec-a from the server for 6 s (the instance TTL is
// 2 s: its lease runs out 1.6 s after its last renewal) in the middle of its two 5 s
// calls. It runs in plain `go test` (about 20 s).
func TestFaultPartitionExecutor(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	e := newEnv(t, 1)
	const run = "partition-exec"
	a, proxy, file := fenceCase(t, e, run, true)
	proxy.cut()
	time.Sleep(6 * time.Second) // the fault itself: longer than TTL + ack wait
	proxy.heal()
	checkFenced(t, e, run, file)
	e.eventually("exec-a logs its lease lost", 10*time.Second, func() error {
		if !strings.Contains(a.logText(), "lease lost") {
			return fmt.Errorf("no lease-lost line in exec-a's log:\n%s", a.logTail(20))
		}
		return nil
	})
}

// TestFaultPauseExecutor stops exec-a (SIGSTOP) for 6 s in the middle of its two 5 s
// calls, then resumes it (SIGCONT): on resuming its tool's wait is over, and the tool
// finds its lease lost before the side effect. It runs in plain `go test` (about 20 s).
func TestFaultPauseExecutor(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	e := newEnv(t, 1)
	const run = "pause-exec"
	a, _, file := fenceCase(t, e, run, false)
	pause(t, a, 6*time.Second)
	checkFenced(t, e, run, file)
}

// pause stops p for d, then resumes it.
func pause(t *testing.T, p *proc, d time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d) // the fault itself
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// TestFaultRestartSameName kills -9 exec-a (instance name "exec-x") with two calls in
// flight and restarts it at once under the same name, as a container keeps its
// hostname and runs as pid 1 again (so <hostname>-<pid> repeats); the restarted process
// serves another tool only, so the calls are redelivered to exec-b. Before the boot id,
// exec-b saw "exec-x" alive (the restarted process heartbeats under that name) and held
// the calls until the run's deadline; now the old instance (name and boot id) expires
// one TTL after its death and exec-b takes the calls over. It runs in plain `go test`.
func TestFaultRestartSameName(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	e := newEnv(t, 1)
	const run = "restart-same-name"
	file := filepath.Join(e.dir, "side-effects")
	e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=append:2x1:4000-4000")
	e.toolbusRole("injector", "injector-1")
	a := e.faultbusRole("executor", "exec-x", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_FAULT_APPEND_FILE="+file)
	e.waitReady([]string{"append"}, "planner", "injector", "executor")
	e.submit([]string{run})
	e.waitClaimed(run, "exec-x", 2, nil)
	a.kill()
	killed := time.Now()
	e.worker(e.faultbus, "executor", "exec-x", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_EXECUTOR_TOOLS=noop")
	e.faultbusRole("executor", "exec-b", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_FAULT_APPEND_FILE="+file)
	// Ack wait (2 s) + TTL (2 s) + a claim poll (1 s) + the 4 s call, with room for a busy
	// machine; before the boot id the calls waited for the run's deadline (10 minutes).
	e.waitCompleted([]string{run}, 60*time.Second)
	t.Logf("completed %v after the kill", time.Since(killed).Round(time.Millisecond))
	tl := e.tally()
	e.checkRuns(tl, []string{run}, 1, 2)
	checkTakenOver(t, file, []string{run}, 1, 2, "exec-b")
}

// TestFaultPauseAndPartitionRoles pauses (SIGSTOP, 6 s) or cuts from the server (a TCP
// proxy, 6 s) the planner or the injector while runs have append calls in flight, then
// resumes it: every run completes, each call has one result and one side effect.
func TestFaultPauseAndPartitionRoles(t *testing.T) {
	suite(t)
	for _, role := range []string{"planner", "injector"} {
		for _, fault := range []string{"pause", "partition"} {
			t.Run(role+"-"+fault, func(t *testing.T) {
				e := newEnv(t, 1)
				file := filepath.Join(e.dir, "side-effects")
				var proxy *tcpProxy
				viaProxy := func(r string) []string {
					if r != role || fault != "partition" {
						return nil
					}
					proxy = newTCPProxy(t, strings.TrimPrefix(e.nodes[0].url(), "nats://"))
					return []string{"TOOLBUS_NATS_URL=" + proxy.url()}
				}
				planner := e.faultbusRole("planner", "planner-1", append([]string{"TOOLBUS_MODEL=append:2x2:500-3000", "TOOLBUS_ACK_WAIT=3s"}, viaProxy("planner")...)...)
				injector := e.faultbusRole("injector", "injector-1", viaProxy("injector")...)
				e.faultbusRole("executor", "exec-1", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_FAULT_APPEND_FILE="+file)
				e.waitReady([]string{"append"}, "planner", "injector", "executor")
				runs := runIDs(role+"-"+fault, 6)
				e.submit(runs)
				e.eventually("calls in flight", 30*time.Second, func() error {
					if n := e.count(events.FilterToolFinished); n < 2 {
						return fmt.Errorf("%d results", n)
					}
					return nil
				})
				target := map[string]*proc{"planner": planner, "injector": injector}[role]
				if fault == "pause" {
					pause(t, target, 6*time.Second)
				} else {
					proxy.cut()
					time.Sleep(6 * time.Second) // the fault itself
					proxy.heal()
				}
				e.waitCompleted(runs, 2*time.Minute)
				e.checkRuns(e.tally(), runs, 2, 2)
				checkSideEffects(t, file, runs, 2, 2)
			})
		}
	}
}

// TestFaultLateResultFenced: a result that exec-a published while its lease held is
// held in the network (a proxy freezes exec-a's connection, both ways, at the moment it
// publishes the result) until exec-b has taken the call over; then it reaches the
// server, after its lease_until, while exec-b's attempt owns the call. The injector
// fences it: the step joins exec-b's result (attempt 2), not the late one, though the
// late one is stored first. The tool ran once in each lease (two side effects: exec-a's
// ran before its result was lost in the network, which no runtime can undo); the run
// completes with one joined result. It runs in plain `go test` (about 20 s).
func TestFaultLateResultFenced(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	e := newEnv(t, 1)
	const run = "late-result"
	file := filepath.Join(e.dir, "side-effects")
	e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=append:1x1:5000-5000")
	e.toolbusRole("injector", "injector-1")
	proxy := newTCPProxy(t, strings.TrimPrefix(e.nodes[0].url(), "nats://"))
	tripped := proxy.holdAtPublish(".tool.finished.")
	e.faultbusRole("executor", "exec-a", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_FAULT_APPEND_FILE="+file, "TOOLBUS_NATS_URL="+proxy.url())
	e.waitReady([]string{"append"}, "planner", "injector", "executor")
	e.submit([]string{run})
	e.waitClaimed(run, "exec-a", 1, e.noResults)
	b := e.faultbusRole("executor", "exec-b", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_FAULT_APPEND_FILE="+file)
	select {
	case <-tripped:
	case <-time.After(60 * time.Second):
		t.Fatal("exec-a never published its result")
	}
	e.waitClaimed(run, "exec-b", 1, nil)
	// exec-b checks once more for a stored result right after its take-over and yields
	// to one (a legitimate outcome, not the path under test): release only once it has
	// passed that check and runs the call, which it logs.
	e.eventually("exec-b runs the call", 60*time.Second, func() error {
		if !strings.Contains(b.logText(), "running it again with the same idempotency key") {
			return errors.New("exec-b has not started the call")
		}
		return nil
	})
	proxy.release() // exec-b's 5 s call has just started: the late result arrives first
	e.waitCompleted([]string{run}, 90*time.Second)

	results := e.tally()[run].finished[callKey{0, "c0"}]
	if len(results) != 2 {
		t.Fatalf("%d results of c0 stored, want exec-a's late one and exec-b's", len(results))
	}
	late, owner := results[0].ToolResult, results[1].ToolResult
	if late.Executor != "exec-a" || late.Attempt != 1 || owner.Executor != "exec-b" || owner.Attempt != 2 {
		t.Fatalf("stored results in order: %s attempt %d, %s attempt %d; want exec-a's (1) before exec-b's (2)",
			late.Executor, late.Attempt, owner.Executor, owner.Attempt)
	}
	// The late result reached the stream after its lease: the path under test is the
	// injector's fence, not the common one.
	ctx, cancel := e.op()
	evs, err := runlog.Read(ctx, e.bus.EventStream(), events.SubjectToolFinished(run, "append"))
	cancel()
	if err != nil || len(evs) != 2 {
		t.Fatalf("read the results: %d, %v", len(evs), err)
	}
	if late.LeaseUntil == nil || !evs[0].Time.After(*late.LeaseUntil) {
		t.Fatalf("exec-a's result was stored at %v, lease_until %v: not late", evs[0].Time, late.LeaseUntil)
	}
	ctx, cancel = e.op()
	rec, _, err := e.bus.Store().Step(ctx, run, 0)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Results) != 1 || rec.Results[0] == nil || rec.Results[0].Executor != "exec-b" || rec.Results[0].Attempt != 2 {
		t.Fatalf("the step joined %+v, want exec-b's result of attempt 2", rec.Results)
	}
	lines := scanLines(t, file)[run+"/0/c0"]
	if len(lines) != 2 || !strings.Contains(lines[0], " exec-a 1 ") || !strings.Contains(lines[1], " exec-b 2 ") {
		t.Fatalf("side effects of c0: %q, want exec-a's (attempt 1) then exec-b's (attempt 2)", lines)
	}
}
