package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// Validate refuses each option out of its range.
func TestOptionsValidate(t *testing.T) {
	good := Options{K: []int{1}, Steps: 2, Storages: []string{"memory"}, Durabilities: []string{"default"}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Options){
		"one step":           func(o *Options) { o.Steps = 1 },
		"short long runs":    func(o *Options) { o.LongSteps, o.LongK = 10, 1 },
		"long runs, no K":    func(o *Options) { o.LongSteps, o.LongK = 20, 0 },
		"K of 0":             func(o *Options) { o.K = []int{1, 0} },
		"unknown durability": func(o *Options) { o.Durabilities = []string{"sometimes"} },
	} {
		o := good
		mod(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A small benchmark measures every column of its row (toolbus, floor, in-process) and
// prints it.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{K: []int{2}, Steps: 2, LatencyRuns: 2, Runs: 4, Storages: []string{"memory"}, Durabilities: []string{"default", "strict"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 1 || len(rep.Long) != 0 {
		t.Fatalf("%d rows, %d long rows; want 1 (strict is skipped on memory), 0", len(rep.Rows), len(rep.Long))
	}
	r := rep.Rows[0]
	if r.K != 2 || r.ToolbusP50MS <= 0 || r.FloorP50MS <= 0 || r.InprocP50MS <= 0 || r.ToolbusCallsPS <= 0 || r.FloorCallsPS <= 0 {
		t.Fatalf("row %+v", r)
	}
	var out bytes.Buffer
	Print(&out, rep)
	if !strings.Contains(out.String(), "memory") {
		t.Fatalf("table:\n%s", out.String())
	}
}
