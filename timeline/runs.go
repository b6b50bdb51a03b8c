package timeline

import (
	"bytes"
	"cmp"
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

// WriteRuns prints run states newest first, as a table or as JSON, each with its calls'
// results by status (calls, by run id: a run that completed may have had calls that
// failed or were rejected).
func WriteRuns(out io.Writer, runs []store.RunState, calls map[string]audit.Calls, now time.Time, asJSON bool) error {
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
			// Calls counts the run's results by status (succeeded, failed, rejected...).
			Calls audit.Calls `json:"calls"`
		}
		rows := make([]row, 0, len(runs))
		for _, r := range runs {
			c := calls[r.RunID]
			if c == nil {
				c = audit.Calls{}
			}
			rows = append(rows, row{RunState: r, AgeMS: now.Sub(r.StartedAt).Milliseconds(), Calls: c})
		}
		return WriteJSON(out, rows)
	}
	if len(runs) == 0 {
		fmt.Fprintln(out, "no runs")
		return nil
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATUS\tSTEP\tCALLS\tAGE\tUPDATED\tREASON")
	for _, r := range runs {
		reason := r.Reason
		if r.Code != "" {
			reason = "[" + r.Code + "] " + reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s ago\t%s\n", r.RunID, r.Status, r.Step, cmp.Or(calls[r.RunID].String(), "-"), audit.Age(now.Sub(r.StartedAt)),
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
