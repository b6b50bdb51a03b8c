package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/timeline"
)

func cmdTools(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("tools", "tools [--json]", errOut)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) != 0 {
		return usageError(fs, "tools: no arguments expected")
	}
	c, err := openReader(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer c.Close()
	rows, err := callrun.ToolRows(ctx, c.Bus)
	if err != nil {
		return err
	}
	if *asJSON {
		return timeline.WriteJSON(out, rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(out, "no tools in the catalog")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tOWNER\tVERSION\tINSTANCES\tPENDING\tIN FLIGHT\tDESCRIPTION")
	for _, r := range rows {
		inst := strings.Join(r.Instances, ",")
		if inst == "" { // a client account is told which tools are offered, not by whom
			inst = map[bool]string{true: "offered", false: "- (not offered)"}[r.Offered]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", r.Name, orDash(r.Owner), orDash(versionText(r.Version)), inst,
			r.Pending, r.InFlight, audit.OneLine(r.Description, 60))
	}
	return tw.Flush()
}

// orDash is s, or "-" when it is empty (a table cell is never blank).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// versionText is a contract's version as `toolbus tools` shows it: "v<n>", "" when
// unversioned (0).
func versionText(v int) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf("v%d", v)
}
