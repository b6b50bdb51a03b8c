package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/internal/node"
)

// `toolbus audit export RUN -o FILE` writes a run's self-contained audit bundle (its
// events as stored, the public keys); `toolbus audit verify FILE` verifies one with no
// bus (package audit/trail).
func cmdAudit(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	if len(args) == 0 || (args[0] != "export" && args[0] != "verify") {
		return &exitError{code: 2, msg: "usage: toolbus audit export RUN -o FILE | toolbus audit verify FILE"}
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet("audit "+sub, "audit export RUN -o FILE | audit verify FILE", errOut)
	file := fs.String("o", "", "the bundle to write (export)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) != 1 || sub == "export" && *file == "" {
		return usageError(fs, "audit: toolbus audit export RUN -o FILE | toolbus audit verify FILE")
	}
	if sub == "verify" {
		b, err := trail.ReadFile(pos[0])
		if err != nil {
			return &exitError{code: 1, msg: err.Error()}
		}
		res, verr := trail.Verify(b)
		if code := trail.Explain(out, b.Run, res, verr); code != 0 {
			return &exitError{code: code}
		}
		return nil
	}
	if !toolbus.ValidRunID(pos[0]) {
		return &exitError{code: 2, msg: fmt.Sprintf("audit: invalid run id %q", pos[0])}
	}
	c, err := openReader(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer c.Close()
	b, err := trail.Collect(ctx, c.Bus, pos[0])
	if err != nil {
		return &exitError{code: 1, msg: err.Error()}
	}
	if err := b.WriteFile(*file); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %s: %d events of run %s, %d public keys\n", *file, len(b.Events), b.Run, len(b.Keys.Keys))
	return nil
}

// verifyRun is replay --verify: the run's trail verified on the live bus.
func verifyRun(ctx context.Context, c *node.Conn, run string, out io.Writer) error {
	b, err := trail.Collect(ctx, c.Bus, run)
	if err != nil {
		return &exitError{code: 1, msg: err.Error()}
	}
	res, verr := trail.Verify(b)
	if code := trail.Explain(out, run, res, verr); code != 0 {
		return &exitError{code: code}
	}
	return nil
}
