package faults_test

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// TestFaultLoad: 1,000 concurrent runs of 3 steps of 4 calls (12,000 calls) with random
// tool latencies (sleep of 1 to 100 ms) over 4 executor processes, one planner and one
// injector on one nats-server process. Every run completes; every call has exactly one
// result, joined in call order (checked by the planner's script model on every step it
// plans, and from the step records). TOOLBUS_LOAD_RUNS overrides the number of runs.
func TestFaultLoad(t *testing.T) {
	suite(t)
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("TOOLBUS_LOAD_RUNS")); err == nil && v > 0 {
		n = v
	}
	const steps, calls = 3, 4
	e := newEnv(t, 1)
	e.faultbusRole("planner", "planner-1", "TOOLBUS_MODEL=sleep:4x3:1-100", "TOOLBUS_CONCURRENCY=128", "TOOLBUS_LOG_LEVEL=warn")
	e.toolbusRole("injector", "injector-1", "TOOLBUS_CONCURRENCY=128", "TOOLBUS_LOG_LEVEL=warn")
	for i := 1; i <= 4; i++ {
		e.toolbusRole("executor", "exec-"+strconv.Itoa(i), "TOOLBUS_CONCURRENCY=64", "TOOLBUS_LOG_LEVEL=warn")
	}
	e.waitReady([]string{"sleep"}, "planner", "injector", "executor")
	runs := runIDs("load", n)

	start := time.Now()
	e.submitN(runs, 64)
	submitted := time.Since(start)
	e.waitCompleted(runs, 10*time.Minute)
	wall := time.Since(start)

	checkStart := time.Now()
	st := e.checkRuns(e.tally(), runs, steps, calls)
	if st.calls != n*steps*calls {
		t.Fatalf("%d calls with a result, want %d", st.calls, n*steps*calls)
	}
	if st.peak < n/2 {
		t.Errorf("at most %d runs were in flight at once: not a concurrent load", st.peak)
	}
	if len(st.byExecutor) != 4 {
		t.Errorf("results by executor %v: want all 4 executors used", st.byExecutor)
	}
	t.Logf("LOAD: %d runs x %d steps x %d calls = %d calls in %v (submitted in %v): %.0f calls/s, %.1f runs/s",
		n, steps, calls, st.calls, wall.Round(time.Millisecond), submitted.Round(time.Millisecond),
		float64(st.calls)/wall.Seconds(), float64(n)/wall.Seconds())
	t.Logf("LOAD: %s; stream checked in %v", st, time.Since(checkStart).Round(time.Millisecond))
}
