package audit

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
)

// Short renderings for people, for the timeline's summaries and the callers that print
// runs: progress, limits, a tool message on one line, a model's name.

// ProgressText says how far a call has come: "40/120 (33%): searched 40 archives",
// "40: ..." when the total is unknown.
func ProgressText(tp toolbus.ToolProgress) string {
	s := strconv.FormatFloat(tp.Done, 'f', -1, 64)
	if tp.Total > 0 {
		s += "/" + strconv.FormatFloat(tp.Total, 'f', -1, 64) + fmt.Sprintf(" (%d%%)", int(100*tp.Done/tp.Total))
	}
	if tp.Message != "" {
		s += ": " + OneLine(tp.Message, 100)
	}
	return "progress " + s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func limitsText(l toolbus.Limits) string {
	var parts []string
	if l.MaxSteps > 0 {
		parts = append(parts, "max_steps "+strconv.Itoa(l.MaxSteps))
	}
	if !l.Deadline.IsZero() {
		parts = append(parts, "deadline "+l.Deadline.UTC().Format(time.RFC3339))
	}
	if l.TokenBudget > 0 {
		parts = append(parts, "token_budget "+strconv.FormatInt(l.TokenBudget, 10))
	}
	if l.CallTimeout > 0 {
		parts = append(parts, "call_timeout "+l.CallTimeout.String())
	}
	return strings.Join(parts, ", ")
}

// ToolMessageText renders a tool message on one line: call id, tool, error flag, the
// start of its content.
func ToolMessageText(m toolbus.Message) string {
	flag := ""
	if m.IsError {
		flag = " [error]"
	}
	return fmt.Sprintf("tool %s %s%s: %s", m.ToolCallID, m.Name, flag, OneLine(m.Content, 100))
}

// OneLine folds s onto one line (runs of white space become one space) and cuts it to
// at most n bytes, on a rune boundary, marking the cut with "...".
func OneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		cut := n
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

// ModelName names the model a run asked for, for people: a script the run carries
// (script:{...}, up to 64 KiB shipped by its client) is named by its size, not printed
// whole.
func ModelName(model string) string {
	if script, ok := strings.CutPrefix(model, "script:{"); ok {
		return fmt.Sprintf("a script shipped with the run (%d bytes)", len(script)+1)
	}
	return model
}
