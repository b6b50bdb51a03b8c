package callrun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/timeline"
)

// The exit codes of `toolbus call`: the status of the tool's result.
const (
	ExitSucceeded = 0
	ExitFailed    = 1 // failed, or the run ended without a result
	ExitUsage     = 2 // bad flags or JSON, unknown tool
	ExitApproval  = 3 // the call waits for approval (as toolbus run)
	ExitRejected  = 4 // rejected: invalid arguments, not authorized, denied
	ExitTimedOut  = 5
	ExitCancelled = 6
)

// Outcome is how a pre-planned run answered: the result of its call, or the run's end
// without one, or the call waiting for approval.
type Outcome struct {
	// Result is the call's result (nil: none came).
	Result *toolbus.ToolResult
	// Ended is the run's outcome when it ended (or waits) before the result.
	Ended toolbus.RunEnded
	// Waiting is true when the call waits for a person's decision.
	Waiting bool
}

// Await follows a pre-planned run on watch until it ends (the result is the
// tool.finished of its call) or its call waits for approval; after hintAfter of silence,
// and at once when the call asks its caller a question, it calls hint once per silence
// with a printer that knows what the run waits for, and progress (when not nil) with
// each progress report of the call while it runs.
func Await(ctx context.Context, watch *runlog.Watcher, hintAfter time.Duration, hint func(*timeline.Printer), progress func(toolbus.ToolProgress)) (Outcome, error) {
	var o Outcome
	done := false
	p := timeline.NewPrinter(io.Discard)
	idleSince, hinted, asked := time.Now(), false, false
	own := NewOwn()
	v := audit.Visitor{
		ToolFinished: func(_ runlog.StoredEvent, tf toolbus.ToolFinished) {
			if own.Is(tf.Step, tf.CallID, tf.Tool) {
				r := tf.ToolResult
				o.Result = &r
			}
		},
		ToolProgress: func(_ runlog.StoredEvent, tp toolbus.ToolProgress) {
			if progress != nil && own.Is(tp.Step, tp.CallID, tp.Tool) && o.Result == nil {
				progress(tp)
			}
		},
		ToolQuestion: func(_ runlog.StoredEvent, q toolbus.ToolQuestion) {
			asked = asked || own.Is(q.Step, q.CallID, q.Tool)
		},
		ToolWaiting: func(_ runlog.StoredEvent, tw toolbus.ToolWaiting) {
			if own.Is(tw.Step, tw.Call.CallID, tw.Call.Tool) {
				o.Waiting, done = true, true
			}
		},
		RunEnded: func(_ runlog.StoredEvent, re toolbus.RunEnded) {
			if re.Status.Terminal() || re.Status == toolbus.RunWaitingForApproval {
				o.Ended, done = re, true
			}
		},
	}
	for !done {
		ev, ok, err := watch.Next(ctx, time.Second)
		if err != nil {
			return Outcome{Ended: o.Ended}, err
		}
		if !ok {
			if !hinted && time.Since(idleSince) >= hintAfter {
				hinted = true
				hint(p)
			}
			continue
		}
		idleSince, hinted = time.Now(), false
		p.Print(ev)
		own.Visit(ev)
		v.Visit(ev)
		if asked && !done {
			// The caller is asked: say what and how to answer now, not after a silence.
			asked, hinted = false, true
			hint(p)
		}
	}
	if o.Ended.Status == toolbus.RunWaitingForApproval {
		o.Waiting = true
	}
	return o, nil
}

// ExitCode maps a result status to the exit code of `toolbus call`.
func ExitCode(s toolbus.Status) int {
	switch s {
	case toolbus.StatusSucceeded:
		return ExitSucceeded
	case toolbus.StatusRejected:
		return ExitRejected
	case toolbus.StatusTimedOut:
		return ExitTimedOut
	case toolbus.StatusCancelled:
		return ExitCancelled
	}
	return ExitFailed
}

// WriteOutput prints a result's output: JSON indented (a JSON string as its text), else
// the text the model reads.
func WriteOutput(out io.Writer, r toolbus.ToolResult) {
	if o := bytes.TrimSpace(r.Output); len(o) > 0 && json.Valid(o) {
		var b bytes.Buffer
		if err := json.Indent(&b, o, "", "  "); err == nil {
			var s string
			if json.Unmarshal(o, &s) == nil {
				fmt.Fprintln(out, s) // a JSON string prints as its text
				return
			}
			fmt.Fprintln(out, b.String())
			return
		}
	}
	fmt.Fprintln(out, r.Content)
}

// UnknownTool says that no executor serves tool and lists the catalog.
func UnknownTool(tool string, cat *store.Catalog) string {
	known := ToolNames(cat)
	if len(known) == 0 {
		return fmt.Sprintf("unknown tool %q: the catalog is empty (is an executor running?)", tool)
	}
	return fmt.Sprintf("unknown tool %q: no executor serves it; the catalog has %s", tool, strings.Join(known, ", "))
}

// ToolNames lists the tools of the catalog, sorted.
func ToolNames(cat *store.Catalog) []string {
	var known []string
	for _, tc := range cat.Tools(nil) {
		known = append(known, tc.Name)
	}
	sort.Strings(known)
	return known
}
