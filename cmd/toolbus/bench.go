package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/bench"
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
	bench.OptionFlags(fs, &opts)
	storages := fs.String("storage", "memory,file", "storage kinds")
	durabilities := fs.String("durability", "default", "durability modes of the server, comma-separated: default (fsync every 2 min), strict (fsync every write; file storage only)")
	scaleTools := fs.String("scale-tools", "10,1000", "tool counts of the scale rows, comma-separated (empty: none): each tool served by two of -scale-deployments deployments, the calls spread over all tools")
	tenants := fs.Bool("tenants", false, "measure instead a quiet tenant's latency while another floods at its quota, with the roles as processes (the -flood-*, -quiet-runs, -tool-ms, -executor* and -tenant-repeat flags)")
	topts := bench.TenantFlags(fs)
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if *tenants {
		return benchTenants(ctx, topts, *jsonPath, out)
	}
	var err error
	if opts.K, err = bench.ParseCounts(*ks); err != nil {
		return &exitError{code: 2, msg: "bench: bad -k " + *ks}
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
