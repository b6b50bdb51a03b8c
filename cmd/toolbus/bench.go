package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/toolbus/toolbus/internal/bench"
)

// cmdBench measures toolbus beside the raw JetStream floor and an in-process loop, in
// one process and one run, and prints a table (and JSON with -json).
func cmdBench(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintln(out, "usage: toolbus bench [flags]   (measure toolbus beside raw JetStream and an in-process loop)")
		fs.PrintDefaults()
	}
	jsonPath := fs.String("json", "", "also write the figures as JSON to this file")
	ks := fs.String("k", "1,4,16", "calls per step")
	opts := bench.Options{Progress: os.Stderr}
	fs.IntVar(&opts.Steps, "steps", 5, "steps per run (the last one answers)")
	fs.IntVar(&opts.LatencyRuns, "latency-runs", 20, "sequential runs for the latency figures")
	fs.IntVar(&opts.Runs, "runs", 200, "runs in flight for the throughput figures")
	storages := fs.String("storage", "memory,file", "storage kinds")
	durabilities := fs.String("durability", "default", "durability modes of the server, comma-separated: default (fsync every 2 min), strict (fsync every write; file storage only)")
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
	scaleTools := fs.String("scale-tools", "10,1000", "tool counts of the scale rows, comma-separated (empty: none): each tool served by two of -scale-deployments deployments, the calls spread over all tools")
	fs.IntVar(&opts.Scale.Deployments, "scale-deployments", 20, "executor deployments of the scale rows")
	fs.IntVar(&opts.Scale.K, "scale-k", 4, "calls per step of the scale rows")
	fs.DurationVar(&opts.Scale.Idle, "scale-idle", bench.DefaultScaleIdle, "how long the idle cost of the scale rows is measured (at least a pull's expiry, so that every queue renews its pull in the window)")
	tenants := fs.Bool("tenants", false, "measure instead a quiet tenant's latency while another floods at its quota, with the roles as processes (the -flood-*, -quiet-runs, -tool-ms, -executor* and -tenant-repeat flags)")
	topts := bench.TenantFlags(fs)
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if *tenants {
		return benchTenants(ctx, topts, *jsonPath, out)
	}
	for _, s := range strings.Split(*ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 1 {
			return &exitError{code: 2, msg: "bench: bad -k " + *ks}
		}
		opts.K = append(opts.K, k)
	}
	opts.Storages, opts.Durabilities = splitList(*storages), splitList(*durabilities)
	if strings.TrimSpace(*scaleTools) != "" {
		for _, s := range splitList(*scaleTools) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return &exitError{code: 2, msg: "bench: bad -scale-tools " + *scaleTools}
			}
			opts.Scale.Tools = append(opts.Scale.Tools, n)
		}
	}
	if err := opts.Validate(); err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	rep, err := bench.Run(ctx, opts)
	if err != nil {
		return err
	}
	bench.Print(out, rep)
	return bench.WriteJSON(*jsonPath, rep, out)
}

// benchTenants runs `toolbus bench -tenants` with this binary as the roles' command.
func benchTenants(ctx context.Context, o *bench.TenantOptions, jsonPath string, out io.Writer) error {
	o.Binary, _ = os.Executable()
	o.Progress = os.Stderr
	if err := o.Validate(); err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	rep, err := bench.RunTenants(ctx, *o)
	if err != nil {
		return err
	}
	bench.PrintTenants(out, rep)
	return bench.WriteJSON(jsonPath, rep, out)
}

// splitList splits a comma-separated flag value, trimming each item.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		out = append(out, strings.TrimSpace(item))
	}
	return out
}
