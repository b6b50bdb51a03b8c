package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// stepMarks finds each mark of a step among a run's stored messages, whatever else the
// run stored around it (other steps, outcome, run state), and makes a hop that began
// before the one before it ended start where that one ended.
func TestStepMarks(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	// Two steps of run r, two calls each, then the answer.
	msgs := []stored{
		{at(0), "toolbus.r.run.started._none"},
		{at(10), "toolbus.r.model.requested"},              // step 0
		{at(20), "$KV.toolbus_history.r.0.a"},              // answer recorded
		{at(30), "toolbus.r.model.responded"},              // responded
		{at(35), "toolbus.r.tool.requested.noop"},          //
		{at(38), "$KV.toolbus_claims.noop.r.0.c0"},         // first claim, before the last call
		{at(40), "toolbus.r.tool.requested.noop"},          // calls published
		{at(50), "$KV.toolbus_claims.noop.r.0.c1"},         // last claim
		{at(55), "toolbus.r.tool.finished.noop"},           //
		{at(60), "$KV.toolbus_history.r.0.s"},              // a first join-state write
		{at(70), "toolbus.r.tool.finished.noop"},           // results
		{at(80), "$KV.toolbus_history.r.0.s"},              // joined
		{at(90), "toolbus.r.model.requested"},              // step 1
		{at(100), "$KV.toolbus_history.r.1.a"},             //
		{at(110), "toolbus.r.model.responded"},             //
		{at(120), "toolbus.r.tool.requested.other"},        //
		{at(121), "toolbus.r.tool.requested.other"},        //
		{at(130), "$KV.toolbus_claims.other.r.1.call=2Ea"}, //
		{at(135), "$KV.toolbus_claims.other.r.1.call=2Eb"}, //
		{at(140), "toolbus.r.tool.finished.other"},         //
		{at(145), "toolbus.r.tool.finished.other"},         //
		{at(150), "$KV.toolbus_history.r.1.s"},             //
		{at(160), "toolbus.r.model.requested"},             // step 2: the answer
		{at(170), "$KV.toolbus_history.r.2.a"},             //
		{at(180), "toolbus.r.model.responded"},             //
		{at(190), "$KV.toolbus_runs.r"},                    //
		{at(200), "toolbus.r.run.completed"},               //
	}
	for _, c := range []struct {
		step int
		want []int // the marks, in µs
	}{
		{0, []int{10, 20, 30, 40, 40, 50, 70, 80, 90}},
		{1, []int{90, 100, 110, 121, 130, 135, 145, 150, 160}},
	} {
		marks, err := stepMarks(msgs, "r", c.step)
		if err != nil {
			t.Fatalf("step %d: %v", c.step, err)
		}
		if len(marks) != len(Hops)+1 {
			t.Fatalf("step %d: %d marks for %d hops", c.step, len(marks), len(Hops))
		}
		for i, m := range marks {
			if m != at(c.want[i]) {
				t.Errorf("step %d mark %d (end of %q) at %v, want %d µs", c.step, i, append([]string{"start"}, Hops...)[i], m.Sub(t0), c.want[i])
			}
		}
	}
	// The step with no calls has no claim: it is no step of the hops.
	if _, err := stepMarks(msgs, "r", 2); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("step without calls: %v", err)
	}
}

// -hops measures every hop of the latency runs' steps; they add up to steps as long as
// the bench's own clock measures (model call to model call).
func TestRunHops(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{K: []int{3}, Steps: 3, LatencyRuns: 4, Runs: 4, Storages: []string{"memory"}, Durabilities: []string{"default"}, Hops: true})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rows[0]
	h := r.Hops
	if h == nil {
		t.Fatal("no hops measured")
	}
	if h.Steps != 4*2 || len(h.P50MS) != len(Hops) {
		t.Fatalf("hops of %d steps, %d hops: want 8 steps (4 runs of 2 steps with calls), %d hops", h.Steps, len(h.P50MS), len(Hops))
	}
	sum := 0.0
	for i, v := range h.P50MS {
		// Each of these ends with a write the one before it waits for.
		mustGrow := map[string]bool{"answer recorded": true, "responded": true, "results": true, "joined": true, "next request": true}
		if v < 0 || mustGrow[Hops[i]] && v <= 0 {
			t.Errorf("hop %q: p50 %.3f ms", Hops[i], v)
		}
		sum += v
	}
	if h.StepP50MS <= 0 || h.StepP50MS < r.ToolbusP50MS/4 || h.StepP50MS > r.ToolbusP50MS*4 {
		t.Errorf("step p50 %.3f ms from the store times, %.3f ms by the bench's clock", h.StepP50MS, r.ToolbusP50MS)
	}
	if h.Cores <= 0 {
		t.Errorf("cores busy %.2f", h.Cores)
	}
	t.Logf("hops %v (sum %.3f), step %.3f ms, clock %.3f ms, %.2f cores", h.P50MS, sum, h.StepP50MS, r.ToolbusP50MS, h.Cores)
}
