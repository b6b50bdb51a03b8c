package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Calls counts a run's tool results by status: what a list of runs shows beside a run's
// status, which says how the run ended, not how its calls did (a run completes when the
// model answers, whatever its calls returned).
type Calls map[toolbus.Status]int

// Total is the number of results.
func (c Calls) Total() int {
	n := 0
	for _, k := range c {
		n += k
	}
	return n
}

// NotSucceeded is the number of results that did not succeed.
func (c Calls) NotSucceeded() int { return c.Total() - c[toolbus.StatusSucceeded] }

// callOrder is the order in which Calls names the statuses.
var callOrder = []toolbus.Status{toolbus.StatusFailed, toolbus.StatusRejected, toolbus.StatusTimedOut, toolbus.StatusCancelled}

// String is "3 calls", or "3 calls: 1 failed, 1 rejected"; "" with no call.
func (c Calls) String() string {
	if c.Total() == 0 {
		return ""
	}
	s := fmt.Sprintf("%d call", c.Total())
	if c.Total() > 1 {
		s += "s"
	}
	var bad []string
	for _, st := range callOrder {
		if c[st] > 0 {
			bad = append(bad, fmt.Sprintf("%d %s", c[st], st))
		}
	}
	if len(bad) > 0 {
		s += ": " + strings.Join(bad, ", ")
	}
	return s
}

// CountCalls counts the results of run from its tool.finished events (direct gets on the
// run's tool.finished subjects, no consumer): the first result of each call counts, as
// the injector joins it.
func CountCalls(ctx context.Context, bus *events.Bus, run string) (Calls, error) {
	w, err := runlog.Watch(ctx, bus, events.SubjectToolFinishedAny(run), true)
	if err != nil {
		return nil, err
	}
	calls, seen := Calls{}, map[string]bool{}
	for {
		ev, ok, err := w.Next(ctx, 0)
		if err != nil {
			return nil, err
		}
		if !ok {
			return calls, nil
		}
		var tf toolbus.ToolFinished
		if ev.Err != nil || ev.Decode(&tf) != nil {
			continue // not a result the injector would join
		}
		key := fmt.Sprintf("%d/%s", tf.Step, tf.CallID)
		if !seen[key] {
			seen[key] = true
			calls[tf.ToolResult.Status]++
		}
	}
}
