package timeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events/store"
)

// WriteJSON prints v as indented JSON, with <, > and & as they are.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteRuns prints run states newest first, as a table or as JSON.
func WriteRuns(out io.Writer, runs []store.RunState, now time.Time, asJSON bool) error {
	sort.SliceStable(runs, func(i, j int) bool {
		if !runs[i].StartedAt.Equal(runs[j].StartedAt) {
			return runs[i].StartedAt.After(runs[j].StartedAt)
		}
		return runs[i].RunID < runs[j].RunID
	})
	if asJSON {
		type row struct {
			store.RunState
			AgeMS int64 `json:"age_ms"`
		}
		rows := make([]row, 0, len(runs))
		for _, r := range runs {
			rows = append(rows, row{RunState: r, AgeMS: now.Sub(r.StartedAt).Milliseconds()})
		}
		return WriteJSON(out, rows)
	}
	if len(runs) == 0 {
		fmt.Fprintln(out, "no runs")
		return nil
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATUS\tSTEP\tAGE\tUPDATED\tREASON")
	for _, r := range runs {
		reason := r.Reason
		if r.Code != "" {
			reason = "[" + r.Code + "] " + reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s ago\t%s\n", r.RunID, r.Status, r.Step, audit.Age(now.Sub(r.StartedAt)),
			audit.Age(now.Sub(r.UpdatedAt)), audit.OneLine(reason, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if line != "" {
			fmt.Fprintln(out, strings.TrimRight(line, " \n"))
		}
	}
	return nil
}
