package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/internal/timeline"
)

// toolRow is one line of `toolbus tools`.
type toolRow struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Owner is the team whose executors serve the tool ("" when the contract names
	// none); Version the contract's version (0 when unversioned).
	Owner     string   `json:"owner"`
	Version   int      `json:"version"`
	Instances []string `json:"instances"`
	// Pending counts calls waiting in the tool's queue; InFlight those being run.
	Pending  uint64 `json:"pending"`
	InFlight int    `json:"in_flight"`
	// Offered is false when no live instance serves the tool: models are not offered it.
	Offered bool `json:"offered"`
}

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
	rows, err := toolRows(ctx, c.Bus)
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

// toolRows joins the catalog, the live instances and the queues; in a client account,
// which reads none of them, the tools the read service says are offered.
func toolRows(ctx context.Context, bus *events.Bus) ([]toolRow, error) {
	if bus.ClientAccount() {
		offered, err := bus.OfferedTools(ctx)
		rows := make([]toolRow, len(offered))
		for i, tc := range offered {
			rows[i] = toolRow{Name: tc.Name, Description: tc.Description, Owner: tc.Owner, Version: tc.Version, Instances: []string{}, Offered: true}
		}
		return rows, err
	}
	contracts, err := bus.Store().Contracts(ctx)
	if err != nil {
		return nil, err
	}
	instances, err := bus.Store().Instances(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]toolRow, 0, len(contracts))
	for _, tc := range contracts {
		r := toolRow{Name: tc.Name, Description: tc.Description, Owner: tc.Owner, Version: tc.Version, Instances: []string{}}
		for _, in := range instances {
			if in.Serves(tc.Owner, tc.Name) {
				r.Instances = append(r.Instances, in.Name)
			}
		}
		r.Offered = len(r.Instances) > 0
		q, err := bus.ToolQueueInfo(ctx, tc.Name)
		if err != nil && !errors.Is(err, events.ErrNotFound) {
			return nil, err
		}
		r.Pending, r.InFlight = q.Pending, q.InFlight
		rows = append(rows, r)
	}
	return rows, nil
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
