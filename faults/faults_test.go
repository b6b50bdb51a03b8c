package faults_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// Each test of the full suite runs the pipeline as separate processes: nats-server,
// faultbus planner (a script model that checks the history it reads), toolbus injector
// and toolbus (or faultbus) executors. It breaks something mid-run and then checks from
// the stream that every run completed with exactly one result per call.

// sleepModel: 4 sleep calls of 50 to 400 ms per step for 3 steps, then an answer.
const sleepModel = "TOOLBUS_MODEL=sleep:4x3:50-400"

// appendModel: the same with side-effecting calls (the append tool of faultbus).
const appendModel = "TOOLBUS_MODEL=append:4x3:50-400"

// TestFaultSideEffectNotRunTwice: an executor runs a side-effecting call (the append tool
// writes the call's idempotency key to a file), the stream stores its result, and the
// executor dies by kill -9 just before acknowledging the call. The call is redelivered
// to another executor, which finds the stored result and does not run the tool again:
// the file holds one line, the stream one result.
func TestFaultSideEffectNotRunTwice(t *testing.T) {
	suite(t)
	e := newEnv(t, 1)
	file := filepath.Join(e.dir, "side-effects.txt")
	e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=append:1x1")
	e.toolbusRole("injector", "injector-1")
	a := e.faultbusRole("executor", "exec-a", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_FAULT_APPEND_FILE="+file,
		"TOOLBUS_FAULT_KILL_AFTER=.tool.finished.append ")
	a.expect() // it kills itself
	e.waitReady([]string{"append"}, "planner", "injector", "executor")
	runs := []string{"side-effect"}
	e.submit(runs)

	e.eventually("exec-a killed itself after storing the result", 30*time.Second, func() error {
		if !a.exited() {
			return fmt.Errorf("exec-a still runs; %d results stored", e.count(events.FilterToolFinished))
		}
		return nil
	})
	if sig, ok := a.signaled(); !ok || sig != syscall.SIGKILL {
		t.Fatalf("exec-a did not die of SIGKILL: %v\n%s", a.cmd.ProcessState, a.logTail(10))
	}
	if n := e.count(events.FilterToolFinished); n != 1 {
		t.Fatalf("%d results stored before the crash, want 1", n)
	}
	ci, err := e.consumerInfo(events.ToolConsumer("append"))
	if err != nil {
		t.Fatal(err)
	}
	if ci.NumAckPending != 1 {
		t.Fatalf("%d calls unacknowledged after the crash, want 1 (the fault must hit between publish and ack)", ci.NumAckPending)
	}

	b := e.faultbusRole("executor", "exec-b", "TOOLBUS_ACK_WAIT=2s", "TOOLBUS_FAULT_APPEND_FILE="+file)
	e.waitCompleted(runs, 60*time.Second)
	e.checkRuns(e.tally(), runs, 1, 1)
	key := "side-effect/0/c0" // run/step/call_id
	lines := scanLines(t, file)
	if len(lines) != 1 || len(lines[key]) != 1 {
		t.Fatalf("side effects %v, want exactly one for %s", lines, key)
	}
	if !strings.Contains(lines[key][0], "exec-a 1") {
		t.Fatalf("side effect %q, want it from exec-a at attempt 1", lines[key][0])
	}
	e.eventually("exec-b logged the skipped call", 10*time.Second, func() error {
		if !strings.Contains(b.logText(), "result already stored, call not run again") {
			return fmt.Errorf("no skip in exec-b log:\n%s", b.logTail(10))
		}
		return nil
	})
	for _, rt := range e.tally() {
		for _, fs := range rt.finished {
			if fs[0].ToolResult.Executor != "exec-a" {
				t.Fatalf("the stored result is from %s, want exec-a's", fs[0].ToolResult.Executor)
			}
		}
	}
	e.eventually("the redelivered call acknowledged", 10*time.Second, func() error {
		ci, err := e.consumerInfo(events.ToolConsumer("append"))
		if err != nil {
			return err
		}
		if ci.NumAckPending != 0 || ci.Delivered.Consumer < 2 {
			return fmt.Errorf("ack pending %d, deliveries %d", ci.NumAckPending, ci.Delivered.Consumer)
		}
		return nil
	})
	t.Logf("side effects: %v; exec-b: %q", lines, grepLine(b.logText(), "result already stored"))
}

func grepLine(text, s string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// TestFaultInjectorKill kills -9 the injector while results of 20 runs are being joined;
// results keep arriving with no injector, then a new injector completes every step. No
// model.requested is published twice.
func TestFaultInjectorKill(t *testing.T) {
	suite(t)
	start := time.Now()
	e := newEnv(t, 1)
	e.faultbusRole("planner", "planner-1", sleepModel)
	e.toolbusRole("executor", "exec-1")
	e.toolbusRole("executor", "exec-2")
	inj := e.toolbusRole("injector", "injector-a")
	e.waitReady([]string{"sleep"}, "planner", "injector", "executor")
	runs := runIDs("inj", 20)
	e.submit(runs)

	// Kill it while it holds results it has not acknowledged (joins in progress).
	e.eventually("results flowing, some in the injector's hands", 60*time.Second, func() error {
		if n := e.count(events.FilterToolFinished); n < 40 {
			return fmt.Errorf("%d results", n)
		}
		ci, err := e.consumerInfo("injector")
		if err != nil {
			return err
		}
		if ci.NumAckPending == 0 {
			return errors.New("no result in flight in the injector")
		}
		return nil
	})
	inj.kill()
	atKill := e.count(events.FilterToolFinished)
	if ci, err := e.consumerInfo("injector"); err == nil {
		t.Logf("%d results were in the dead injector's hands (unacknowledged)", ci.NumAckPending)
	}
	partial := 0
	for _, run := range runs {
		for s := 0; s < 3; s++ {
			ctx, cancel := e.op()
			if rec, _, err := e.bus.Store().Step(ctx, run, s); err == nil && !rec.Complete() {
				partial++
			}
			cancel()
		}
	}
	t.Logf("injector killed with %d results stored and %d steps joined partly", atKill, partial)
	if partial == 0 {
		t.Fatal("no step was mid-join when the injector died")
	}
	// Results keep coming with no injector; the next steps wait.
	e.eventually("more results with no injector", 30*time.Second, func() error {
		if n := e.count(events.FilterToolFinished); n < atKill+8 {
			return fmt.Errorf("%d results", n)
		}
		return nil
	})
	e.toolbusRole("injector", "injector-b")
	e.waitCompleted(runs, 3*time.Minute)
	st := e.checkRuns(e.tally(), runs, 3, 4)
	if st.modelRequests != len(runs)*4 {
		t.Fatalf("%d model.requested, want %d", st.modelRequests, len(runs)*4)
	}
	t.Logf("%s; took %v", st, time.Since(start).Round(time.Millisecond))
}

// TestFaultInjectorKillAfterPublish kills -9 an injector at the worst moment of a join:
// it has joined the last result of a step and published the next model.requested, but
// has neither closed the step record nor acknowledged the result. A new injector (the
// real binary) gets the result again and re-drives the step (its model.requested is the
// same event id, dropped by the stream); every run completes with one model.requested
// per step.
func TestFaultInjectorKillAfterPublish(t *testing.T) {
	suite(t)
	start := time.Now()
	e := newEnv(t, 1)
	e.faultbusRole("planner", "planner-1", sleepModel)
	e.toolbusRole("executor", "exec-1")
	inj := e.faultbusRole("injector", "injector-a", "TOOLBUS_FAULT_KILL_AFTER=.model.requested ",
		"TOOLBUS_FAULT_KILL_SKIP=/0/model.requested")
	inj.expect()
	e.waitReady([]string{"sleep"}, "planner", "injector", "executor")
	runs := runIDs("injpub", 10)
	e.submit(runs)
	e.eventually("injector-a killed itself after publishing a model.requested", 60*time.Second, func() error {
		if !inj.exited() {
			return errors.New("injector-a still runs")
		}
		return nil
	})
	if sig, ok := inj.signaled(); !ok || sig != syscall.SIGKILL {
		t.Fatalf("injector-a did not die of SIGKILL: %v\n%s", inj.cmd.ProcessState, inj.logTail(10))
	}
	line := grepLine(inj.logText(), "fault injected")
	subject := ""
	if i := strings.Index(line, `after="HPUB `); i >= 0 {
		subject = strings.TrimSuffix(line[i+len(`after="HPUB `):], `"`)
	}
	run, _ := events.RunIDFromSubject(subject)
	if run == "" {
		t.Fatalf("no fault line in the log of injector-a:\n%s", inj.logTail(10))
	}
	// The step it was joining: the last complete one (nothing joins after the kill), its
	// next step requested, the result that completed it not acknowledged.
	open := -1
	for s := 0; s < 3; s++ {
		ctx, cancel := e.op()
		rec, _, err := e.bus.Store().Step(ctx, run, s)
		cancel()
		if err == nil && rec.Complete() {
			open = s
		}
	}
	if open < 0 {
		t.Fatalf("no complete step in %s after the kill (%s)", run, line)
	}
	if n := e.count(events.SubjectModelRequested(run)); n != open+2 {
		t.Fatalf("%s: %d model.requested after the kill, want %d (through step %d)", run, n, open+2, open+1)
	}
	t.Logf("injector-a died right after publishing %s: step %d of %s joined, its next step requested and the result not acknowledged", subject, open, run)

	e.toolbusRole("injector", "injector-b")
	e.waitCompleted(runs, 2*time.Minute)
	// The result injector-a never acknowledged comes back to injector-b after the ack
	// wait (30 s) and re-drives the step: nothing new is published.
	e.eventually("injector-b handled the results injector-a held", 60*time.Second, func() error {
		ci, err := e.consumerInfo("injector")
		if err != nil {
			return err
		}
		if ci.NumAckPending != 0 || ci.NumPending != 0 || ci.NumRedelivered != 0 {
			return fmt.Errorf("injector consumer: %d pending, %d unacknowledged, %d redelivered", ci.NumPending, ci.NumAckPending, ci.NumRedelivered)
		}
		return nil
	})
	st := e.checkRuns(e.tally(), runs, 3, 4)
	if st.modelRequests != len(runs)*4 {
		t.Fatalf("%d model.requested, want %d", st.modelRequests, len(runs)*4)
	}
	t.Logf("%s; took %v", st, time.Since(start).Round(time.Millisecond))
}

// TestFaultNATSRestart stops the NATS server (file store) mid-run and starts it again on
// the same port and store: the workers reconnect and every run completes. The calls are
// side effects (the append tool writes each call's idempotency key to a file): each ran
// exactly once.
func TestFaultNATSRestart(t *testing.T) {
	suite(t)
	start := time.Now()
	e := newEnv(t, 1)
	file := filepath.Join(e.dir, "side-effects.txt")
	e.faultbusRole("planner", "planner-1", appendModel)
	exec1 := e.faultbusRole("executor", "exec-1", "TOOLBUS_FAULT_APPEND_FILE="+file)
	e.faultbusRole("executor", "exec-2", "TOOLBUS_FAULT_APPEND_FILE="+file)
	e.toolbusRole("injector", "injector-1")
	e.waitReady([]string{"append"}, "planner", "injector", "executor")
	runs := runIDs("restart", 30)
	e.submit(runs)
	e.eventually("results flowing", 60*time.Second, func() error {
		if n := e.count(events.FilterToolFinished); n < 60 {
			return fmt.Errorf("%d results", n)
		}
		return nil
	})
	node := e.nodes[0]
	node.proc.stop(30 * time.Second)
	down := time.Now()
	e.restartNode(node)
	t.Logf("nats-server restarted after %v down", time.Since(down).Round(time.Millisecond))
	e.waitCompleted(runs, 3*time.Minute)
	st := e.checkRuns(e.tally(), runs, 3, 4)
	n := checkSideEffects(t, file, runs, 3, 4)
	e.eventually("exec-1 reconnected", 10*time.Second, func() error {
		if !strings.Contains(exec1.logText(), "nats reconnected") {
			return fmt.Errorf("no reconnection in the log of exec-1")
		}
		return nil
	})
	t.Logf("%s; %d side effects, each once; took %v", st, n, time.Since(start).Round(time.Millisecond))
}

// TestFaultClusterNodeLoss runs on a 3-node JetStream cluster with the stream and
// buckets replicated 3 times (TOOLBUS_REPLICAS=3) and kills -9 the node leading the
// stream mid-run: the workers move to the other nodes and every run completes. The calls
// are side effects, each ran exactly once (the ack wait and the executors' leases, 30 s
// each, outlast the leader elections).
func TestFaultClusterNodeLoss(t *testing.T) {
	suite(t)
	start := time.Now()
	e := newEnv(t, 3)
	file := filepath.Join(e.dir, "side-effects.txt")
	e.faultbusRole("planner", "planner-1", appendModel)
	e.faultbusRole("executor", "exec-1", "TOOLBUS_FAULT_APPEND_FILE="+file)
	e.faultbusRole("executor", "exec-2", "TOOLBUS_FAULT_APPEND_FILE="+file)
	e.toolbusRole("injector", "injector-1")
	e.waitReady([]string{"append"}, "planner", "injector", "executor")
	ctx, cancel := e.op()
	info, err := e.bus.EventStream().Info(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream is not R3: replicas %d, cluster %+v", info.Config.Replicas, info.Cluster)
	}
	runs := runIDs("cluster", 30)
	e.submit(runs)
	e.eventually("results flowing", 60*time.Second, func() error {
		if n := e.count(events.FilterToolFinished); n < 60 {
			return fmt.Errorf("%d results", n)
		}
		return nil
	})
	ctx, cancel = e.op()
	info, err = e.bus.EventStream().Info(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	var victim *natsNode
	for _, n := range e.nodes {
		if n.name == info.Cluster.Leader {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("no node leads the stream: %+v", info.Cluster)
	}
	stored := e.count(events.FilterToolFinished)
	victim.proc.kill()
	t.Logf("killed %s, the stream leader, with %d results stored", victim.name, stored)
	e.waitCompleted(runs, 3*time.Minute)
	st := e.checkRuns(e.tally(), runs, 3, 4)
	n := checkSideEffects(t, file, runs, 3, 4)
	ctx, cancel = e.op()
	info, err = e.bus.EventStream().Info(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s; %d side effects, each once; new stream leader %s; took %v", st, n, info.Cluster.Leader, time.Since(start).Round(time.Millisecond))
}

// TestFaultKeptStartsOutliveTheirInjector kills -9 the injector (the real binary) while
// it keeps the run.started of young runs instead of their deadline timers (no planner:
// the runs never get past step 0). A new injector gets the run.started again after the
// ack wait, arms each timer, and every run ends limit_reached / deadline: one timer
// event and one outcome per run, and no run.started left unacknowledged.
func TestFaultKeptStartsOutliveTheirInjector(t *testing.T) {
	suite(t)
	const ackWait = 20 * time.Second // a run.started is kept for half of it
	e := newEnv(t, 1)
	wait := "TOOLBUS_ACK_WAIT=" + ackWait.String()
	inj := e.toolbusRole("injector", "injector-a", wait)
	e.eventually("the injector's run.started consumer", 60*time.Second, func() error {
		ci, err := e.consumerInfo(events.ConsumerInjectorStarted)
		if err != nil {
			return err
		}
		if ci.Config.AckWait != ackWait {
			return fmt.Errorf("ack wait %v, want %v", ci.Config.AckWait, ackWait)
		}
		return nil
	})
	runs := runIDs("kept", 10)
	deadline := time.Now().Add(2 * ackWait).UTC()
	for _, run := range runs {
		ctx, cancel := e.op()
		err := e.bus.StartRun(ctx, events.Source("faults", "test"), toolbus.RunStarted{
			RunID: run, Model: "faultbus", Principal: toolbus.Principal{ID: "faults"},
			Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "run " + run}},
			Limits:   toolbus.Limits{Deadline: deadline},
		})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	e.eventually("every run.started kept, no timer yet", ackWait/2, func() error {
		ci, err := e.consumerInfo(events.ConsumerInjectorStarted)
		if err != nil {
			return err
		}
		if ci.NumAckPending != len(runs) {
			return fmt.Errorf("%d run.started kept", ci.NumAckPending)
		}
		return nil
	})
	if n := e.count(events.FilterTimers); n != 0 {
		t.Fatalf("%d timers published while the runs were young, want 0", n)
	}
	inj.kill()
	e.toolbusRole("injector", "injector-b", wait)
	e.eventually("every run ended by its deadline", 3*time.Minute, func() error {
		for _, run := range runs {
			ctx, cancel := e.op()
			st, _, err := e.bus.Store().RunState(ctx, run)
			cancel()
			if err != nil {
				return err
			}
			if st.Status != toolbus.RunLimitReached || st.Code != toolbus.LimitDeadline {
				return fmt.Errorf("run %s is %s/%s", run, st.Status, st.Code)
			}
		}
		return nil
	})
	e.eventually("one outcome per run", 30*time.Second, func() error {
		outcomes := e.counts(events.SubjectRunEnded("*", toolbus.RunLimitReached))
		if len(outcomes) != len(runs) {
			return fmt.Errorf("outcomes %v", outcomes)
		}
		return nil
	})
	for subject, n := range e.counts(events.FilterTimers) {
		if n != 1 {
			t.Errorf("%d timers on %s, want 1", n, subject)
		}
	}
	if n := len(e.counts(events.FilterTimers)); n != len(runs) {
		t.Errorf("timers of %d runs, want %d", n, len(runs))
	}
	for subject, n := range e.counts(events.SubjectRunEnded("*", toolbus.RunLimitReached)) {
		if n != 1 {
			t.Errorf("%d outcomes on %s, want 1", n, subject)
		}
	}
	e.eventually("no run.started left unacknowledged", 30*time.Second, func() error {
		ci, err := e.consumerInfo(events.ConsumerInjectorStarted)
		if err != nil {
			return err
		}
		if ci.NumAckPending != 0 || ci.NumPending != 0 {
			return fmt.Errorf("run.started: %d unacknowledged, %d waiting", ci.NumAckPending, ci.NumPending)
		}
		return nil
	})
}
