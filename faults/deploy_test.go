package faults_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
)

// TestFaultDeployments runs three executor deployments as separate processes on one
// NATS server: x (two replicas: append_a, append_b), y (append_b, append_c: overlaps x)
// and z (append_c). Then y and z stop, the queue of append_c is deleted (a fresh queue
// on a stream that holds finished runs), and a late deployment serving all three tools
// joins. Then every executor restarts on the same stream. A side-effect file counts
// every execution: each call ran exactly once, on a process that serves its tool, and
// every run completed with one result per call. It runs in plain `go test` (~40 s).
func TestFaultDeployments(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	e := newEnv(t, 1)
	file := filepath.Join(e.dir, "side-effects")
	tools := []string{"append_a", "append_b", "append_c"}
	e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=append_a+append_b+append_c:3x2:1-30")
	e.toolbusRole("injector", "injector-1")
	serves := map[string][]string{
		"x-1": {"append_a", "append_b"}, "x-2": {"append_a", "append_b"},
		"y-1":    {"append_b", "append_c"},
		"z-1":    {"append_c"},
		"late-1": {"append_a", "append_b", "append_c"},
	}
	procs := map[string]*proc{}
	start := func(inst string) {
		procs[inst] = e.faultbusRole("executor", inst, "TOOLBUS_FAULT_APPEND_FILE="+file,
			"TOOLBUS_FAULT_APPEND_TOOLS="+strings.Join(tools, ","),
			"TOOLBUS_EXECUTOR_TOOLS="+strings.Join(serves[inst], ","))
	}
	for _, inst := range []string{"x-1", "x-2", "y-1", "z-1"} {
		start(inst)
	}
	e.waitReady(tools, "planner", "injector", "executor")
	first := runIDs("dep1", 8)
	e.submit(first)
	e.waitCompleted(first, 2*time.Minute)

	// y and z leave; append_c's queue is dropped with them, so the late deployment
	// creates it again on a stream that already holds its finished calls.
	procs["y-1"].stop(10 * time.Second)
	procs["z-1"].stop(10 * time.Second)
	ctx, cancel := e.op()
	if err := e.bus.QueueStream().DeleteConsumer(ctx, events.ToolConsumer("append_c")); err != nil {
		t.Fatal(err)
	}
	cancel()
	start("late-1")
	e.waitReady(tools, "executor")
	second := runIDs("dep2", 6)
	e.submit(second)
	e.waitCompleted(second, 2*time.Minute)

	// Restart every executor on the same stream: nothing with a result runs again.
	for _, inst := range []string{"x-1", "x-2", "late-1"} {
		procs[inst].stop(10 * time.Second)
		start(inst)
	}
	e.waitReady(tools, "executor")
	e.eventually("tool queues drained", time.Minute, func() error {
		for _, tool := range tools {
			ci, err := e.consumerInfo(events.ToolConsumer(tool))
			if err != nil {
				return err
			}
			if ci.NumPending != 0 || ci.NumAckPending != 0 {
				return fmt.Errorf("%s: %d pending, %d in flight", tool, ci.NumPending, ci.NumAckPending)
			}
		}
		return nil
	})

	all := append(first, second...)
	checkSideEffects(t, file, all, 2, 3)
	ranOn := map[string]int{}
	for key, lines := range scanLines(t, file) {
		for _, line := range lines {
			f := strings.Fields(line)
			if len(f) != 4 {
				t.Fatalf("side effect line %q", line)
			}
			inst, tool := f[1], f[3]
			if !slices.Contains(serves[inst], tool) {
				t.Errorf("%s: %s ran on %s, which does not serve it", key, tool, inst)
			}
			ranOn[inst]++
		}
	}
	if ranOn["late-1"] == 0 {
		t.Errorf("the late deployment ran nothing: %v", ranOn)
	}
	st := e.checkRuns(e.tally(), all, 2, 3)
	t.Logf("%s; executions per instance %v", st, ranOn)
}
