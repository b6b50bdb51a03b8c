package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit/trail"
)

// cmdAudit is `toolbus audit export RUN -o FILE` and `toolbus audit verify FILE`
// (package audit/trail).
func cmdAudit(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("audit", "audit export RUN -o FILE | audit verify FILE", errOut)
	file := fs.String("o", "", "the bundle to write (export)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	switch {
	case len(pos) == 2 && pos[0] == "verify":
		return exitCode(trail.VerifyFile(pos[1], out))
	case len(pos) != 2 || pos[0] != "export" || *file == "" || !toolbus.ValidRunID(pos[1]):
		return usageError(fs, "audit: toolbus audit export RUN -o FILE | toolbus audit verify FILE")
	}
	c, err := openReader(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer c.Close()
	return trail.Export(ctx, c.Bus, pos[1], *file, out)
}

// exitCode is nil for 0, else the exit with that code.
func exitCode(code int) error {
	if code == 0 {
		return nil
	}
	return &exitError{code: code}
}
