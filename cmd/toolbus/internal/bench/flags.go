package bench

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// OptionFlags defines the flags of `toolbus bench` that set opts directly (the lists and
// the modes are parsed by the command).
func OptionFlags(fs *flag.FlagSet, opts *Options) {
	fs.IntVar(&opts.Steps, "steps", 5, "steps per run (the last one answers)")
	fs.IntVar(&opts.LatencyRuns, "latency-runs", 20, "sequential runs for the latency figures")
	fs.IntVar(&opts.Runs, "runs", 200, "runs in flight for the throughput figures")
	fs.IntVar(&opts.LongSteps, "long-steps", 100, "steps of the long runs (the long-run table; 0: none)")
	fs.IntVar(&opts.LongK, "long-k", 4, "calls per step of the long runs")
	fs.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the saturated toolbus case to this file (one file per row, named after it, when there are several rows; a scale row also writes the profile of its idle window, with the suffix -idle)")
	fs.BoolVar(&opts.Diag, "diag", false, "also count the workers' debug records (handed-back messages, consume errors) in the trouble line (costs CPU of its own)")
	fs.IntVar(&opts.Repeat, "repeat", 1, "measure each row this many times in a row and print the spread of its calls/s (min, max, max/min) with the stalls, pull restarts and redeliveries of each measurement")
	fs.BoolVar(&opts.Sign, "sign", false, "sign every event, as processes with TOOLBUS_SIGNING_KEY do")
	fs.BoolVar(&opts.ReadMirror, "read-mirror", false, "set toolbus up with the read mirror of its event stream, as toolbus init does by default (not the scale rows)")
	fs.BoolVar(&opts.FairShare, "fair", false, "set toolbus up with fair share (TOOLBUS_FAIR_SHARE: calls staged, released by the fair scheduler) (not the scale rows)")
	fs.BoolVar(&opts.Subjects, "subjects", false, "also count the toolbus messages per call by kind of subject (costs CPU of its own)")
	fs.BoolVar(&opts.Hops, "hops", false, "also show where a step waits, one run in flight: the median of each hop (planner, executors, injector) from the times the server stored each event, record and claim of the latency runs")
	fs.IntVar(&opts.Scale.Deployments, "scale-deployments", 20, "executor deployments of the scale rows")
	fs.IntVar(&opts.Scale.K, "scale-k", 4, "calls per step of the scale rows")
	fs.DurationVar(&opts.Scale.Idle, "scale-idle", DefaultScaleIdle, "how long the idle cost of the scale rows is measured (at least a pull's expiry, so that every queue renews its pull in the window)")
}

// ParseCounts parses a comma-separated list of positive counts (-k).
func ParseCounts(list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bench: bad count %q", s)
		}
		out = append(out, n)
	}
	return out, nil
}
