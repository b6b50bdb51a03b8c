package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/timeline"
)

// `toolbus replay <run>` is the auditor's view of a run: it reads the run's events from
// the stream in order (nothing is executed, no store but the stream is read), prints the
// timeline, rebuilds the transcript the model was sent and checks the invariants of the
// contract. The analysis (audit.Analyze) is a pure function of the events.

// cmdReplay prints the audit of a run and exits 1 when an invariant is broken.
func cmdReplay(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("replay", "replay <run> [--json] [--verify]", errOut)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	verify := fs.Bool("verify", false, "also verify the run's audit trail: signatures, signers, chain, checkpoint (exit 1 naming the first event that fails, 3 for a run with no signed event)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) != 1 {
		return usageError(fs, "replay: give the run id")
	}
	run := pos[0]
	if !toolbus.ValidRunID(run) {
		return &exitError{code: 2, msg: fmt.Sprintf("replay: invalid run id %q", run)}
	}
	c, err := openReader(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer c.Close()
	evs, err := runlog.Events(ctx, c.Bus, run)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if len(evs) == 0 {
		return &exitError{code: 1, msg: fmt.Sprintf("run %s not found: no events on %s", run, events.SubjectRun(run))}
	}
	r := audit.Analyze(run, evs)
	if *asJSON {
		if err := timeline.WriteJSON(out, r); err != nil {
			return err
		}
	} else {
		r.WriteText(out)
	}
	if code := trail.VerifyLive(ctx, c.Bus, run, out, *verify); code != 0 {
		return &exitError{code: code}
	}
	if !r.OK {
		return &exitError{code: 1, msg: fmt.Sprintf("run %s breaks %d invariant(s)", run, len(r.Violations))}
	}
	return nil
}
