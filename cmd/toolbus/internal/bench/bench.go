// Package bench measures the toolbus pipeline beside the raw JetStream floor (the
// same hops with no toolbus logic) and an in-process loop (no bus), in one process:
// the figures of `toolbus bench` and docs/performance.md.
package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus/embedded"
)

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
