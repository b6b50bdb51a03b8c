// Package bench measures the toolbus pipeline beside the raw JetStream floor (the
// same hops with no toolbus logic) and an in-process loop (no bus), in one process:
// the figures of `toolbus bench` and docs/performance.md.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/seal"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

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

// Options are what a benchmark measures (the flags of toolbus bench).
type Options struct {
	// K lists the calls per step, one row each.
	K []int
	// Steps per run (the last one answers), at least 2.
	Steps int
	// LatencyRuns are the sequential runs of the latency figures.
	LatencyRuns int
	// Runs in flight for the throughput figures.
	Runs int
	// Storages lists the storage kinds: memory, file.
	Storages []string
	// Durabilities lists the server's durability modes: default (fsync every 2 min),
	// strict (fsync every write; file storage only).
	Durabilities []string
	// LongSteps are the steps of the long runs (0: no long-run table), at least 20;
	// LongK their calls per step.
	LongSteps, LongK int
	// Scale lists the scale rows (none when Scale.Tools is empty); they use Steps
	// and Runs, default durability and each storage.
	Scale ScaleOptions
	// CPUProfile, when set, is where a CPU profile of the saturated toolbus case is
	// written (one file per row, named after it, when there are several rows).
	CPUProfile string
	// Subjects counts the toolbus messages of the saturated case by kind of subject
	// (a subscription to every subject: it costs CPU of its own, so the CPU figures of
	// such a run are not comparable).
	Subjects bool
	// Diag counts the workers' debug records too (handed-back messages, consume errors),
	// at some CPU cost.
	Diag bool
	// Repeat measures each row this many times in a row (0 or 1: once); the report
	// then has a row per measurement and their spread.
	Repeat int
	// Hops measures where the steps of the latency runs wait, hop by hop, from the
	// times the server stored each event, record and claim (HopRow).
	Hops bool
	// ReadMirror sets toolbus up with the read mirror of the event stream, as `toolbus
	// init` does by default (the server then copies every event into it, and the
	// event stream is read through its API instead of direct gets); the floor has none.
	ReadMirror bool
	// FairShare sets toolbus up with fair share (events.Config.FairShare) and runs the
	// fair scheduler beside the injector.
	FairShare bool
	// Sign signs every event, as processes with TOOLBUS_SIGNING_KEY do (one key: the
	// cost is a signature per event whoever signs).
	Sign bool
	// Progress receives a line per row done (nil: none).
	Progress io.Writer
}

// Validate reports the first option out of its range.
func (o Options) Validate() error {
	if o.Steps < 2 {
		return errors.New("bench: -steps must be at least 2")
	}
	if o.Repeat < 0 {
		return errors.New("bench: -repeat must be at least 1")
	}
	if o.LongSteps != 0 && (o.LongSteps < 20 || o.LongK < 1) {
		return errors.New("bench: -long-steps must be 0 or at least 20, -long-k at least 1")
	}
	for _, n := range o.Scale.Tools {
		if n < 1 || o.Scale.Deployments < 1 || o.Scale.K < 1 {
			return errors.New("bench: -scale-tools must be at least 1, -scale-deployments and -scale-k at least 1")
		}
	}
	for _, k := range o.K {
		if k < 1 {
			return fmt.Errorf("bench: bad -k %d", k)
		}
	}
	for _, d := range o.Durabilities {
		if d != "default" && d != "strict" {
			return fmt.Errorf("bench: bad -durability %s (default, strict)", d)
		}
	}
	return nil
}

// Run measures toolbus beside the raw JetStream floor and an in-process loop, in this
// process, for each storage, durability and K of opts.
func Run(ctx context.Context, opts Options) (Report, error) {
	if err := opts.Validate(); err != nil {
		return Report{}, err
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	rep := Report{When: time.Now().UTC(), Machine: machine()}
	type combo struct{ storage, mode string }
	var combos []combo
	for _, storage := range opts.Storages {
		for _, mode := range opts.Durabilities {
			if mode == "strict" && storage == "memory" {
				continue // nothing to fsync
			}
			combos = append(combos, combo{storage, mode})
		}
	}
	repeat := max(1, opts.Repeat)
	for _, c := range combos {
		for _, k := range opts.K {
			for r := range repeat {
				prof := opts.CPUProfile
				if prof != "" && len(combos)*len(opts.K)*repeat > 1 {
					ext := filepath.Ext(prof)
					suffix := ""
					if repeat > 1 {
						suffix = fmt.Sprintf("-r%d", r+1)
					}
					prof = fmt.Sprintf("%s-%s-%s-k%d%s%s", strings.TrimSuffix(prof, ext), c.storage, c.mode, k, suffix, ext)
				}
				row, err := benchOne(ctx, c.storage, c.mode, k, opts, prof)
				if repeat > 1 {
					row.Repeat = r + 1
				}
				if err != nil {
					return rep, err
				}
				rep.Rows = append(rep.Rows, row)
				if repeat > 1 {
					fmt.Fprintf(progress, "bench: %s %s K=%d done (%d of %d: %.0f calls/s)\n", row.Storage, row.Durability, k, r+1, repeat, row.ToolbusCallsPS)
				} else {
					fmt.Fprintf(progress, "bench: %s %s K=%d done\n", row.Storage, row.Durability, k)
				}
			}
		}
		if opts.LongSteps > 0 {
			lr, err := benchLong(ctx, c.storage, c.mode, opts.LongK, opts.LongSteps, 3)
			if err != nil {
				return rep, err
			}
			rep.Long = append(rep.Long, lr)
			fmt.Fprintf(progress, "bench: %s %s long runs of %d steps done\n", c.storage, c.mode, opts.LongSteps)
		}
	}
	rep.Spread = Spread(rep.Rows)
	for _, storage := range opts.Storages {
		for _, n := range opts.Scale.Tools {
			prof := opts.CPUProfile
			if prof != "" {
				ext := filepath.Ext(prof)
				prof = fmt.Sprintf("%s-%s-scale-%d%s", strings.TrimSuffix(prof, ext), storage, n, ext)
			}
			sr, err := benchScale(ctx, storage, n, opts.Scale, opts.Steps, opts.Runs, opts.Subjects, prof)
			if err != nil {
				return rep, fmt.Errorf("bench scale: %w", err)
			}
			rep.Scale = append(rep.Scale, sr)
			fmt.Fprintf(progress, "bench: %s scale %d tools done\n", storage, n)
		}
	}
	return rep, nil
}

func machine() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s, %d CPUs", h, numCPU())
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

// startServer starts an embedded server on a store directory of its own (fsync on
// every write when strict); stop stops it and removes the directory.
func startServer(strict bool) (srv *embedded.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "toolbus-bench-")
	if err != nil {
		return nil, nil, err
	}
	srv, err = embedded.Start(embedded.Config{Port: -1, StoreDir: dir, SyncAlways: strict})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	return srv, func() { srv.Stop(); _ = os.RemoveAll(dir) }, nil
}

func benchOne(ctx context.Context, storage, durability string, k int, opts Options, cpuProfile string) (Row, error) {
	steps, latRuns, runs := opts.Steps, opts.LatencyRuns, opts.Runs
	row := Row{Storage: storage, Durability: durability, K: k, Steps: steps, Runs: runs, ReadMirror: opts.ReadMirror, FairShare: opts.FairShare, Signed: opts.Sign}
	srv, stopServer, err := startServer(durability == "strict")
	if err != nil {
		return row, err
	}
	defer stopServer()
	memory := storage == "memory"

	// toolbus
	in0 := serverMsgs(srv)
	var subj *subjectCounter
	if opts.Subjects {
		if subj, err = countSubjects(srv); err != nil {
			return row, err
		}
	}
	trbl := newTrouble()
	trbl.debug = opts.Diag
	var hops *hopSamples
	if opts.Hops {
		hops = &hopSamples{}
	}
	lat, tput, cpu, err := benchToolbus(ctx, srv, setup{memory, opts.ReadMirror, opts.FairShare, opts.Sign}, k, steps, latRuns, runs, cpuProfile, trbl, hops)
	row.Redelivered, row.Trouble = trbl.summary()
	row.Stalls, row.PullRestarts = trbl.stalls.Load(), trbl.restarts.Load()
	if subj != nil {
		row.Subjects = subj.stop(float64((runs + latRuns + 1) * (steps - 1) * k))
	}
	row.ToolbusMsgsPerCall = float64(serverMsgs(srv)-in0) / float64((runs+latRuns+1)*(steps-1)*k)
	if err != nil {
		return row, fmt.Errorf("bench toolbus: %w", err)
	}
	if hops != nil {
		// Read once the row's messages are counted: the reads are the bench's, not toolbus's.
		if row.Hops, err = measureHops(ctx, srv, row, hops); err != nil {
			return row, err
		}
	}
	calls := float64(runs * (steps - 1) * k)
	row.ToolbusP50MS, row.ToolbusP99MS = pct(lat, 50), pct(lat, 99)
	row.ToolbusCallsPS = tput * float64(k)
	row.ToolbusStepsPS = tput
	row.ToolbusCPUUSPerCall = float64(cpu.Microseconds()) / calls

	// raw JetStream floor: the same hops per step, no toolbus logic
	in0 = serverMsgs(srv)
	flat, ftput, fcpu, err := benchFloor(ctx, srv, memory, k, steps, latRuns, runs, &row.FloorRedelivered)
	row.FloorMsgsPerCall = float64(serverMsgs(srv)-in0) / float64((runs+latRuns+1)*(steps-1)*k)
	if err != nil {
		return row, fmt.Errorf("bench floor: %w", err)
	}
	row.FloorP50MS, row.FloorP99MS = pct(flat, 50), pct(flat, 99)
	row.FloorCallsPS = ftput * float64(k)
	row.FloorCPUUSPerCall = float64(fcpu.Microseconds()) / calls

	// in-process loop: the same executor, no bus
	ilat, itput := benchInproc(ctx, k, steps, latRuns, runs)
	row.InprocP50MS = pct(ilat, 50)
	row.InprocCallsPS = itput * float64(k)

	if row.FloorP50MS > 0 {
		row.LatencyVsFloor = row.ToolbusP50MS / row.FloorP50MS
	}
	if row.InprocP50MS > 0 {
		row.LatencyVsInproc = row.ToolbusP50MS / row.InprocP50MS
	}
	if row.FloorCallsPS > 0 {
		row.ThroughputVFloor = row.ToolbusCallsPS / row.FloorCallsPS
	}
	return row, nil
}

// serverMsgs is the number of messages the server received from clients so far.
func serverMsgs(srv *embedded.Server) int64 {
	v, err := srv.Varz(nil)
	if err != nil {
		return 0
	}
	return v.InMsgs
}

// serverOutMsgs is how many messages the server sent so far.
func serverOutMsgs(srv *embedded.Server) int64 {
	v, err := srv.Varz(nil)
	if err != nil {
		return 0
	}
	return v.OutMsgs
}

func pct(d []time.Duration, p int) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return float64(s[i].Microseconds()) / 1000
}

// stepClock records when each step of each run reached the model.
type stepClock struct {
	mu    sync.Mutex
	times map[string][]time.Time
}

func (c *stepClock) mark(run string, step int) {
	now := time.Now()
	c.mu.Lock()
	ts := c.times[run]
	for len(ts) <= step {
		ts = append(ts, time.Time{})
	}
	if ts[step].IsZero() {
		ts[step] = now
	}
	c.times[run] = ts
	c.mu.Unlock()
}

func (c *stepClock) latencies(run string) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts := c.times[run]
	var out []time.Duration
	for i := 1; i < len(ts); i++ {
		out = append(out, ts[i].Sub(ts[i-1]))
	}
	return out
}

// benchStack is toolbus in one process on an embedded server: an executor, a planner
// and an injector with an instant scripted model that records when each step reached it.
type benchStack struct {
	bus   *events.Bus
	trbl  *trouble
	clock *stepClock
	ended chan string
	close func()
}

// setup is how the bench's toolbus is set up: memory storage, the read mirror, fair share,
// signed events.
type setup struct{ memory, readMirror, fair, sign bool }

// newBenchStack starts the stack; runs whose id starts with "long" last longSteps steps,
// the others steps.
func newBenchStack(ctx context.Context, srv *embedded.Server, set setup, k, steps, longSteps, runs int, trbl *trouble) (*benchStack, error) {
	nc, err := srv.Connect()
	if err != nil {
		return nil, err
	}
	var cleanup []func()
	st := &benchStack{trbl: trbl, clock: &stepClock{times: map[string][]time.Time{}}, ended: make(chan string, runs),
		close: func() {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}}
	cleanup = append(cleanup, nc.Close)
	fail := func(err error) (*benchStack, error) { st.close(); return nil, err }
	var mirror []provision.Option
	if set.readMirror {
		mirror = append(mirror, provision.WithReadMirror())
	}
	if st.bus, _, err = provision.Setup(ctx, nc, events.Config{Memory: set.memory, Stream: "TOOLBUS", FairShare: set.fair}, mirror...); err != nil {
		return fail(err)
	}
	if set.sign {
		kf, err := seal.NewKeyFile(seal.SignerName(seal.KindRole, "bench"))
		if err != nil {
			return fail(err)
		}
		st.bus.SetSigner(seal.SignerOf(kf))
	}
	log := slog.New(st.trbl)
	short, long := NoopScript(k, steps), NoopScript(k, longSteps)
	model := planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		st.clock.mark(req.RunID, req.Step)
		if strings.HasPrefix(req.RunID, "long") {
			return long.Complete(ctx, req)
		}
		return short.Complete(ctx, req)
	})
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "diag"); err != nil {
		return fail(err)
	}
	exec, err := executor.New(reg, executor.WithLogger(log), executor.WithInstance("bench"))
	if err != nil {
		return fail(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	cleanup = append(cleanup, func() { stop(); wg.Wait() })
	const conc = 256
	runW := func(f func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); _ = f(wctx) }()
	}
	wc := workerconfig.WorkerConfig{Instance: "bench", Concurrency: conc, Logger: log, Grace: time.Second}
	w, err := worker.New(st.bus, exec, worker.Config{WorkerConfig: wc, Observer: st.trbl})
	if err != nil {
		return fail(err)
	}
	runW(w.Run)
	var cat *store.Catalog
	for i := 0; i < 200; i++ {
		if cat, err = st.bus.Store().WatchCatalog(wctx, log); err != nil {
			return fail(err)
		}
		if _, ok := cat.Lookup("noop"); ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	maxSteps := max(steps, longSteps) + 1
	p, err := planner.New(st.bus, model, cat, planner.Config{WorkerConfig: wc, Observer: st.trbl})
	if err != nil {
		return fail(err)
	}
	in, err := injector.New(st.bus, injector.Config{WorkerConfig: wc, Observer: st.trbl, Defaults: toolbus.DefaultLimits{MaxSteps: maxSteps}})
	if err != nil {
		return fail(err)
	}
	runW(p.Run)
	runW(withCheckpoints(set.sign, st.bus, log, in.Run))
	if set.fair {
		fs, err := newFair(ctx, st.bus, log)
		if err != nil {
			return fail(err)
		}
		runW(fs.Run)
	}
	sub, err := nc.Subscribe("toolbus.*.run.*", func(m *nats.Msg) {
		if strings.Contains(m.Subject, ".run.started.") || strings.Contains(m.Subject, ".run.cancel.") {
			return
		}
		run, _ := events.RunIDFromSubject(m.Subject)
		st.ended <- run
	})
	if err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, func() { _ = sub.Unsubscribe() })
	return st, nil
}

func (st *benchStack) start(ctx context.Context, run string, steps int) error {
	return st.bus.StartRun(ctx, "/toolbus/bench/1", toolbus.RunStarted{RunID: run,
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "bench"}}, Limits: toolbus.Limits{MaxSteps: steps + 1}})
}

func (st *benchStack) wait(n int) error {
	timeout := time.After(5 * time.Minute)
	stalled := time.NewTicker(3 * time.Second)
	defer stalled.Stop()
	for i := 0; i < n; {
		select {
		case <-st.ended:
			i++
			stalled.Reset(3 * time.Second)
		case <-stalled.C:
			st.trbl.stalls.Add(1)
			if st.trbl.debug {
				st.trbl.note("stalled 3 s: " + st.consumers())
			}
		case <-timeout:
			return errors.New("runs did not finish in 5 minutes")
		}
	}
	return nil
}

// consumers describes the stream's consumers that have work: what a stall waits on.
func (st *benchStack) consumers() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var out []string
	for _, name := range []string{st.bus.Config().Stream, events.QueueStreamName(st.bus.Config().Stream)} {
		s, err := st.bus.JetStream().Stream(ctx, name)
		if err != nil {
			continue
		}
		for ci := range s.ListConsumers(ctx).Info() {
			if ci.NumPending+uint64(ci.NumAckPending)+uint64(ci.NumRedelivered) == 0 {
				continue
			}
			out = append(out, fmt.Sprintf("%s{pending %d, ack pending %d, redelivered %d, waiting %d}",
				ci.Name, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting))
		}
	}
	return strings.Join(out, " ")
}

// hopSamples are the latency runs whose hops are measured (Options.Hops), and the CPU
// and wall time they took.
type hopSamples struct {
	runs      []string
	cpu, wall time.Duration
}

func benchToolbus(ctx context.Context, srv *embedded.Server, set setup, k, steps, latRuns, runs int, cpuProfile string, trbl *trouble, hops *hopSamples) ([]time.Duration, float64, time.Duration, error) {
	st, err := newBenchStack(ctx, srv, set, k, steps, 0, runs+latRuns+1, trbl)
	if err != nil {
		return nil, 0, 0, err
	}
	defer st.close()
	prefix := fmt.Sprintf("b%d-%d-", k, time.Now().UnixNano()%1e9)
	// warm up
	if err := st.start(ctx, prefix+"warm", steps); err != nil {
		return nil, 0, 0, err
	}
	if err := st.wait(1); err != nil {
		return nil, 0, 0, err
	}
	var (
		lat       []time.Duration
		latRunIDs []string
	)
	lt0, lc0 := time.Now(), cpuTime()
	for i := 0; i < latRuns; i++ {
		run := prefix + "lat" + strconv.Itoa(i)
		if err := st.start(ctx, run, steps); err != nil {
			return nil, 0, 0, err
		}
		if err := st.wait(1); err != nil {
			return nil, 0, 0, err
		}
		lat = append(lat, st.clock.latencies(run)...)
		latRunIDs = append(latRunIDs, run)
	}
	if hops != nil {
		hops.runs, hops.cpu, hops.wall = latRunIDs, cpuTime()-lc0, time.Since(lt0)
	}
	stopProfile, err := startCPUProfile(cpuProfile)
	if err != nil {
		return nil, 0, 0, err
	}
	defer stopProfile()
	t0, c0 := time.Now(), cpuTime()
	for i := 0; i < runs; i++ {
		if err := st.start(ctx, prefix+"tp"+strconv.Itoa(i), steps); err != nil {
			return nil, 0, 0, err
		}
	}
	if err := st.wait(runs); err != nil {
		return nil, 0, 0, err
	}
	el := time.Since(t0).Seconds()
	return lat, float64(runs*(steps-1)) / el, cpuTime() - c0, nil
}

// benchLong runs n runs of steps steps, one at a time, and compares the latency of
// their first steps with that of their last ones.
func benchLong(ctx context.Context, storage, durability string, k, steps, n int) (LongRow, error) {
	row := LongRow{Storage: storage, Durability: durability, K: k, Steps: steps, Runs: n}
	srv, stopServer, err := startServer(durability == "strict")
	if err != nil {
		return row, err
	}
	defer stopServer()
	st, err := newBenchStack(ctx, srv, setup{memory: storage == "memory"}, k, steps, steps, n+1, newTrouble())
	if err != nil {
		return row, fmt.Errorf("bench long runs: %w", err)
	}
	defer st.close()
	prefix := fmt.Sprintf("long%d-%d-", k, time.Now().UnixNano()%1e9)
	var first, last []time.Duration
	for i := 0; i <= n; i++ { // the first run warms up
		run := prefix + strconv.Itoa(i)
		if err := st.start(ctx, run, steps); err != nil {
			return row, err
		}
		if err := st.wait(1); err != nil {
			return row, err
		}
		lat := st.clock.latencies(run) // lat[i] is step i+1
		if i == 0 || len(lat) < 20 {
			continue
		}
		first = append(first, lat[:10]...)
		last = append(last, lat[len(lat)-10:]...)
	}
	row.FirstP50MS, row.LastP50MS = pct(first, 50), pct(last, 50)
	if row.FirstP50MS > 0 {
		row.LastVFirst = row.LastP50MS / row.FirstP50MS
	}
	return row, nil
}

func numCPU() int { return runtime.NumCPU() }

// NoopScript asks for k noop calls at each of the first steps-1 steps, then answers.
func NoopScript(k, steps int) planner.Model {
	return planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		if req.Step >= steps-1 {
			return planner.Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, Content: "done"}}, nil
		}
		calls := make([]toolbus.ToolCall, k)
		for i := range calls {
			calls[i] = toolbus.ToolCall{CallID: "c" + strconv.Itoa(i), Tool: "noop", Arguments: `{}`}
		}
		return planner.Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}}, nil
	})
}

// startCPUProfile writes a CPU profile to path until stop is called (nothing when path
// is empty).
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// withCheckpoints runs the injector's run and, where it signs, its checkpoints beside it
// (as internal/node does): a signed row measures both.
func withCheckpoints(sign bool, bus *events.Bus, log *slog.Logger, run func(context.Context) error) func(context.Context) error {
	if !sign {
		return run
	}
	return func(ctx context.Context) error {
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- (&checkpoint.Service{Bus: bus, Log: log}).Run(cctx) }()
		err := run(ctx)
		stop()
		<-done
		return err
	}
}
