package audit

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
)

// WriteText prints the report for people: the timeline, the transcript and the
// invariants (`toolbus replay`).
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "run %s: %s", r.RunID, r.Status)
	if r.Code != "" {
		fmt.Fprintf(w, " [%s]", r.Code)
	}
	fmt.Fprintf(w, " after %d step(s), %d tokens, %d ms, %d events\n", r.Steps, r.Usage.Total(), r.DurationMS, r.Events)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "timeline (stream order; +ms from run.started):")
	for _, e := range r.Timeline {
		label := e.Type
		if e.CallID != "" {
			label += " " + e.CallID
			if e.Tool != "" {
				label += " " + e.Tool
			}
		}
		mark := ""
		if e.AfterEnd {
			mark = " (after the end)"
		}
		fmt.Fprintf(w, "  #%-4d %8s  step %-2d %s: %s%s\n", e.Seq, "+"+strconv.FormatInt(e.AtMS, 10), e.Step, label, e.Summary, mark)
		for _, d := range e.Details {
			fmt.Fprintf(w, "  %24s%s\n", "", d)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "transcript (%d messages, as sent to the model", len(r.Transcript))
	for _, q := range r.Requests {
		fmt.Fprintf(w, "; step %d: 1-%d", q.Step, q.Messages)
	}
	fmt.Fprintln(w, "):")
	for i, m := range r.Transcript {
		var text string
		switch m.Role {
		case toolbus.RoleTool:
			text = ToolMessageText(m)
		case toolbus.RoleAssistant:
			text = strings.TrimRight("assistant: "+OneLine(m.Content, 120), " ")
			if m.Reasoning != "" {
				text += " [reasoning: " + OneLine(m.Reasoning, 60) + "]"
			}
			for _, c := range m.ToolCalls {
				text += fmt.Sprintf("\n%8s-> %s %s(%s)", "", c.CallID, c.Tool, OneLine(c.Arguments, 80))
			}
		default:
			text = string(m.Role) + ": " + OneLine(m.Content, 120)
		}
		fmt.Fprintf(w, "  %3d  %s\n", i+1, strings.TrimRight(text, " "))
	}
	fmt.Fprintln(w)
	if r.OK {
		results := 0
		for _, c := range r.Calls {
			if c.Result != nil {
				results++
			}
		}
		fmt.Fprintf(w, "invariants: ok (%s, %s, one result per call, in call order, no orphan, terminal state consistent)\n",
			plural(len(r.Calls), "call"), plural(results, "result"))
		return
	}
	fmt.Fprintf(w, "invariants: %d violation(s)\n", len(r.Violations))
	for _, v := range r.Violations {
		where := ""
		if v.Seq != 0 {
			where = fmt.Sprintf(" #%d", v.Seq)
		}
		fmt.Fprintf(w, "  %s%s: %s\n", v.Code, where, v.Message)
	}
}

// plural counts things in English: 1 call, 2 calls.
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// Age renders a duration the way people read ages: 4s, 3m12s, 5h2m, 3d4h.
func Age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}
