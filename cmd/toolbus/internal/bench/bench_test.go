package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
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
		"negative repeat":    func(o *Options) { o.Repeat = -1 },
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

// -repeat measures each row that many times in a row and reports their spread.
func TestRunRepeat(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{K: []int{1}, Steps: 2, LatencyRuns: 1, Runs: 4, Storages: []string{"memory"}, Durabilities: []string{"default"}, Repeat: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 || rep.Rows[0].Repeat != 1 || rep.Rows[1].Repeat != 2 {
		t.Fatalf("rows %+v, want the row twice, numbered 1 and 2", rep.Rows)
	}
	if len(rep.Spread) != 1 || rep.Spread[0].Measurements != 2 || rep.Spread[0].MinCallsPS <= 0 || rep.Spread[0].MaxOverMin < 1 || len(rep.Spread[0].Stalls) != 2 {
		t.Fatalf("spread %+v", rep.Spread)
	}
	var out bytes.Buffer
	Print(&out, rep)
	if !strings.Contains(out.String(), "max/min") {
		t.Fatalf("table:\n%s", out.String())
	}
}

// Spread takes the extremes of each row's measurements and lists the trouble of each.
func TestSpread(t *testing.T) {
	row := func(k, repeat int, callsPS, xFloor float64, stalls int64) Row {
		return Row{Storage: "file", Durability: "default", K: k, Repeat: repeat, ToolbusCallsPS: callsPS, ThroughputVFloor: xFloor, Stalls: stalls}
	}
	got := Spread([]Row{row(16, 1, 3000, 0.3, 0), row(16, 2, 400, 0.04, 5), row(16, 3, 2800, 0.28, 0), row(4, 1, 1000, 0.2, 0), row(1, 0, 9, 9, 9)})
	if len(got) != 2 {
		t.Fatalf("%d spread rows, want 2 (a row measured once has none): %+v", len(got), got)
	}
	s := got[0]
	if s.K != 16 || s.Measurements != 3 || s.MinCallsPS != 400 || s.MaxCallsPS != 3000 || s.MaxOverMin != 7.5 ||
		s.MinXFloor != 0.04 || s.MaxXFloor != 0.3 || joinInts(s.Stalls) != "0/5/0" {
		t.Fatalf("spread %+v", s)
	}
	if got[1].K != 4 || got[1].MaxOverMin != 1 {
		t.Fatalf("spread %+v", got[1])
	}
}

// A small scale row sets up a queue per tool, binds each to two deployments, spreads
// the calls over every tool and measures each column.
func TestScaleSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{K: []int{1}, Steps: 2, LatencyRuns: 1, Runs: 2, Storages: []string{"memory"}, Durabilities: []string{"default"},
		Scale: ScaleOptions{Tools: []int{5}, Deployments: 3, K: 3, Idle: 100 * time.Millisecond, ParkAfter: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Scale) != 1 {
		t.Fatalf("%d scale rows, want 1", len(rep.Scale))
	}
	r := rep.Scale[0]
	// 5 tools over 3 deployments: each tool served by two of them.
	// Every binding idle past ParkAfter is parked when the idle cost is measured.
	if r.Tools != 5 || r.Bound != 10 || r.Parked != 10 || r.Consumers < 5 || r.MaxConsumers <= 1000 || r.CallsPS <= 0 || r.MsgsPerCall <= 0 || r.InitMS <= 0 {
		t.Fatalf("scale row %+v", r)
	}
	var out bytes.Buffer
	Print(&out, rep)
	if !strings.Contains(out.String(), "deployments") {
		t.Fatalf("table:\n%s", out.String())
	}
}

// Every tool is served by two deployments, whatever the numbers.
func TestServedBy(t *testing.T) {
	for _, c := range []struct{ tools, deps int }{{10, 20}, {1000, 20}, {5, 3}, {1, 4}} {
		names := scaleTools(c.tools)
		count := map[string]int{}
		for d := range c.deps {
			served := servedBy(names, d, c.deps)
			if len(served) == 0 {
				t.Errorf("%d tools, %d deployments: deployment %d serves nothing", c.tools, c.deps, d)
			}
			for _, n := range served {
				count[n]++
			}
		}
		for _, n := range names {
			if count[n] < 2 && c.deps > 1 && c.tools > 1 {
				t.Errorf("%d tools, %d deployments: %s served by %d", c.tools, c.deps, n, count[n])
			}
		}
	}
}

// -read-mirror sets toolbus up as `toolbus init` does by default: with the read mirror
// of its event stream, which then serves no direct gets; the rows say so.
func TestRunWithReadMirror(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, mirror := range []bool{false, true} {
		srv, stop, err := startServer(false)
		if err != nil {
			t.Fatal(err)
		}
		st, err := newBenchStack(ctx, srv, setup{memory: true, readMirror: mirror}, 1, 2, 0, 1, newTrouble())
		if err != nil {
			stop()
			t.Fatal(err)
		}
		_, err = st.bus.JetStream().Stream(ctx, events.ReadMirrorName("TOOLBUS"))
		direct := st.bus.EventStream().CachedInfo().Config.AllowDirect
		st.close()
		stop()
		if (err == nil) != mirror || direct == mirror {
			t.Fatalf("read mirror %v: the mirror's lookup says %v, the event stream serves direct gets: %v", mirror, err, direct)
		}
	}
	rep, err := Run(ctx, Options{K: []int{1}, Steps: 2, LatencyRuns: 1, Runs: 2, Storages: []string{"memory"}, Durabilities: []string{"default"}, ReadMirror: true})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	Print(&out, rep)
	if !rep.Rows[0].ReadMirror || !strings.Contains(out.String(), "read mirror") {
		t.Fatalf("the row does not say it ran with the read mirror: %+v\n%s", rep.Rows[0], out.String())
	}
}
