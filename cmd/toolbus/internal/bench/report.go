package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// The report: a row per storage, durability and K, the spread of rows measured several
// times, the long runs, and the tables Print writes of them.

// Row is one line of the bench table.
type Row struct {
	Storage string `json:"storage"`
	// ReadMirror: toolbus ran with the read mirror of the event stream (-read-mirror).
	ReadMirror bool `json:"read_mirror,omitempty"`
	// FairShare: toolbus ran with its calls staged for the fair scheduler (-fair).
	FairShare bool `json:"fair_share,omitempty"`
	// Signed: every event was signed (-sign).
	Signed bool `json:"signed,omitempty"`
	// Durability is default or strict (the server fsyncs every write).
	Durability string `json:"durability"`
	K          int    `json:"calls_per_step"`
	Steps      int    `json:"steps_per_run"`
	// One run in flight: per-step latency.
	ToolbusP50MS float64 `json:"toolbus_step_p50_ms"`
	ToolbusP99MS float64 `json:"toolbus_step_p99_ms"`
	FloorP50MS   float64 `json:"floor_step_p50_ms"`
	FloorP99MS   float64 `json:"floor_step_p99_ms"`
	InprocP50MS  float64 `json:"inproc_step_p50_ms"`
	// R runs in flight: throughput.
	Runs           int     `json:"runs_in_flight"`
	ToolbusCallsPS float64 `json:"toolbus_calls_per_s"`
	ToolbusStepsPS float64 `json:"toolbus_steps_per_s"`
	FloorCallsPS   float64 `json:"floor_calls_per_s"`
	InprocCallsPS  float64 `json:"inproc_calls_per_s"`
	// CPU time of the whole process (toolbus and the embedded server) per call while
	// saturated: unlike calls/s, it hardly moves when other work shares the machine.
	ToolbusCPUUSPerCall float64 `json:"toolbus_cpu_us_per_call"`
	FloorCPUUSPerCall   float64 `json:"floor_cpu_us_per_call"`
	// Messages the server received per call while saturated (publishes, requests,
	// acknowledgements): the bus work a call costs, whatever the machine.
	ToolbusMsgsPerCall float64 `json:"toolbus_server_msgs_per_call"`
	FloorMsgsPerCall   float64 `json:"floor_server_msgs_per_call"`
	LatencyVsFloor     float64 `json:"latency_toolbus_over_floor"`
	LatencyVsInproc    float64 `json:"latency_toolbus_over_inproc"`
	ThroughputVFloor   float64 `json:"throughput_toolbus_over_floor"`
	// Subjects splits the toolbus messages per call of the saturated case by kind of
	// subject (with Options.Subjects).
	Subjects map[string]float64 `json:"toolbus_msgs_per_call_by_subject,omitempty"`
	// Redelivered counts the deliveries of toolbus messages after the first, and
	// Trouble names them and the warnings logged, over the whole toolbus case (a healthy
	// row has none: a collapse shows here).
	Redelivered      int64  `json:"toolbus_redelivered"`
	FloorRedelivered int64  `json:"floor_redelivered"`
	Trouble          string `json:"toolbus_trouble,omitempty"`
	// Stalls counts the 3 s windows of the toolbus case in which no run ended, and
	// PullRestarts the pulls the consume loops made again because the server held
	// none for them (events/consume): a collapse shows in either.
	Stalls       int64 `json:"toolbus_stalls"`
	PullRestarts int64 `json:"toolbus_pull_restarts"`
	// Repeat numbers the measurement of this row (1..Options.Repeat) when it is
	// measured several times in a row; 0 when once.
	Repeat int `json:"repeat,omitempty"`
	// Hops is where the steps of the latency runs waited (Options.Hops).
	Hops *HopRow `json:"hops,omitempty"`
}

// SpreadRow is what several measurements in a row of one row (Options.Repeat) spread
// over: the slowest and the fastest calls/s of the saturated case and their ratio, and
// per measurement the stalls, pull restarts and redeliveries.
type SpreadRow struct {
	Storage      string  `json:"storage"`
	Durability   string  `json:"durability"`
	K            int     `json:"calls_per_step"`
	Measurements int     `json:"measurements"`
	MinCallsPS   float64 `json:"min_calls_per_s"`
	MaxCallsPS   float64 `json:"max_calls_per_s"`
	MaxOverMin   float64 `json:"max_over_min"`
	// MinXFloor and MaxXFloor are the extremes of toolbus calls/s over the floor's of the
	// same measurement (less sensitive to the load of a shared machine).
	MinXFloor    float64 `json:"min_throughput_over_floor"`
	MaxXFloor    float64 `json:"max_throughput_over_floor"`
	Stalls       []int64 `json:"stalls"`
	PullRestarts []int64 `json:"pull_restarts"`
	Redelivered  []int64 `json:"redelivered"`
}

// Spread computes the spread of every row measured more than once in rows.
func Spread(rows []Row) []SpreadRow {
	var out []SpreadRow
	idx := map[string]int{}
	for _, r := range rows {
		if r.Repeat == 0 {
			continue
		}
		key := fmt.Sprintf("%s/%s/%d", r.Storage, r.Durability, r.K)
		i, ok := idx[key]
		if !ok {
			i = len(out)
			idx[key] = i
			out = append(out, SpreadRow{Storage: r.Storage, Durability: r.Durability, K: r.K,
				MinCallsPS: r.ToolbusCallsPS, MaxCallsPS: r.ToolbusCallsPS, MinXFloor: r.ThroughputVFloor, MaxXFloor: r.ThroughputVFloor})
		}
		sp := &out[i]
		sp.Measurements++
		sp.MinCallsPS, sp.MaxCallsPS = min(sp.MinCallsPS, r.ToolbusCallsPS), max(sp.MaxCallsPS, r.ToolbusCallsPS)
		sp.MinXFloor, sp.MaxXFloor = min(sp.MinXFloor, r.ThroughputVFloor), max(sp.MaxXFloor, r.ThroughputVFloor)
		sp.Stalls = append(sp.Stalls, r.Stalls)
		sp.PullRestarts = append(sp.PullRestarts, r.PullRestarts)
		sp.Redelivered = append(sp.Redelivered, r.Redelivered)
	}
	for i := range out {
		if out[i].MinCallsPS > 0 {
			out[i].MaxOverMin = out[i].MaxCallsPS / out[i].MinCallsPS
		}
	}
	return out
}

// LongRow is one line of the long-run table: the step latency at the start and at the
// end of runs of many steps, one run in flight. History reads that grew with the run
// would show as a last/first ratio above 1.
type LongRow struct {
	Storage    string `json:"storage"`
	Durability string `json:"durability"`
	K          int    `json:"calls_per_step"`
	Steps      int    `json:"steps_per_run"`
	Runs       int    `json:"runs"`
	// FirstP50MS is the p50 of steps 1-10, LastP50MS of the last ten steps.
	FirstP50MS float64 `json:"first_steps_p50_ms"`
	LastP50MS  float64 `json:"last_steps_p50_ms"`
	LastVFirst float64 `json:"last_over_first"`
}

// Report is what a benchmark measured: a row per storage, durability and K, and the
// long runs.
type Report struct {
	When    time.Time  `json:"when"`
	Machine string     `json:"machine"`
	Rows    []Row      `json:"rows"`
	Long    []LongRow  `json:"long_runs,omitempty"`
	Scale   []ScaleRow `json:"scale,omitempty"`
	// Spread summarizes the rows measured several times in a row (Options.Repeat).
	Spread []SpreadRow `json:"spread,omitempty"`
}

// Print writes the report as tables.
func Print(out io.Writer, rep Report) {
	if len(rep.Rows) > 0 && rep.Rows[0].ReadMirror {
		fmt.Fprintln(out, "toolbus with the read mirror of its event stream (-read-mirror), the floor without")
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "storage\tdurability\tK\tstep p50 ms\tp99 ms\tfloor p50\tin-proc p50\tx floor\tx in-proc\t\truns\tcalls/s\tsteps/s\tfloor calls/s\tin-proc calls/s\tx floor\tCPU us/call\tfloor CPU\tmsgs/call\tfloor msgs\t")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.4f\t%.2f\t%.0f\t\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.0f\t%.0f\t%.1f\t%.1f\t\n",
			r.Storage, r.Durability, r.K, r.ToolbusP50MS, r.ToolbusP99MS, r.FloorP50MS, r.InprocP50MS, r.LatencyVsFloor, r.LatencyVsInproc,
			r.Runs, r.ToolbusCallsPS, r.ToolbusStepsPS, r.FloorCallsPS, r.InprocCallsPS, r.ThroughputVFloor,
			r.ToolbusCPUUSPerCall, r.FloorCPUUSPerCall, r.ToolbusMsgsPerCall, r.FloorMsgsPerCall)
	}
	tw.Flush()
	for _, r := range rep.Rows {
		name := fmt.Sprintf("%s %s K=%d", r.Storage, r.Durability, r.K)
		if r.Repeat > 0 {
			name += fmt.Sprintf(" (%d)", r.Repeat)
		}
		if r.Trouble != "" {
			fmt.Fprintf(out, "%s: %s\n", name, r.Trouble)
		}
		if r.FloorRedelivered > 0 {
			fmt.Fprintf(out, "%s: floor redelivered %d\n", name, r.FloorRedelivered)
		}
	}
	printSpread(out, rep.Spread)
	var hops []HopRow
	for _, r := range rep.Rows {
		if r.Hops != nil {
			hops = append(hops, *r.Hops)
		}
	}
	printHops(out, hops)
	printSubjects(out, rep)
	printScale(out, rep.Scale)
	if len(rep.Long) == 0 {
		return
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "long runs\tdurability\tK\tsteps\truns\tsteps 1-10 p50 ms\tlast 10 p50 ms\tlast/first\t")
	for _, r := range rep.Long {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.3f\t%.3f\t%.2f\t\n", r.Storage, r.Durability, r.K, r.Steps, r.Runs, r.FirstP50MS, r.LastP50MS, r.LastVFirst)
	}
	tw.Flush()
}

// printSpread writes the spread of the rows measured several times in a row.
func printSpread(out io.Writer, spread []SpreadRow) {
	if len(spread) == 0 {
		return
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "spread\tdurability\tK\tn\tmin calls/s\tmax calls/s\tmax/min\tx floor min\tx floor max\tstalls\tpull restarts\tredelivered\t")
	for _, s := range spread {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t\n", s.Storage, s.Durability, s.K, s.Measurements,
			s.MinCallsPS, s.MaxCallsPS, s.MaxOverMin, s.MinXFloor, s.MaxXFloor, joinInts(s.Stalls), joinInts(s.PullRestarts), joinInts(s.Redelivered))
	}
	tw.Flush()
}

// joinInts writes counts per measurement as 0/2/0.
func joinInts(v []int64) string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(parts, "/")
}
