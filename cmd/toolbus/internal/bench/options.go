package bench

import (
	"errors"
	"fmt"
	"io"
)

// The options of a benchmark (the flags of toolbus bench) and the ranges they accept.

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
