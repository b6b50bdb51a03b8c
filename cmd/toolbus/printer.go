package main

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// errNatsTimeout is what a watch fetch returns when no event came in time.
var errNatsTimeout = nats.ErrTimeout

// printer renders a run's events as a human timeline.
type printer struct {
	out io.Writer
	// last is the type of the last event printed, and open the calls of the current step
	// without a result (call id -> tool): what the run waits for.
	last string
	open map[string]string
	// model is the model the planner answered with, printed when it first shows.
	model string
}

func newPrinter(out io.Writer) *printer { return &printer{out: out, open: map[string]string{}} }

// waitingFor says what the run waits for after the last event printed, and the durable
// consumers whose workers would serve it.
func (p *printer) waitingFor() (string, []string) {
	switch p.last {
	case "", events.TypeRunStarted, events.TypeToolFinished:
		return "the injector", []string{events.ConsumerInjector + "-started", events.ConsumerInjector}
	case events.TypeModelRequested:
		return "the planner (the model's answer)", []string{events.ConsumerPlanner}
	case events.TypeModelResponded, events.TypeToolRequested:
		seen := map[string]bool{}
		var tools, cons []string
		for _, tool := range p.open {
			if !seen[tool] {
				seen[tool] = true
				tools = append(tools, tool)
			}
		}
		sort.Strings(tools)
		for _, tool := range tools {
			cons = append(cons, events.ToolConsumer(tool))
		}
		if len(tools) == 0 {
			return "the injector", []string{events.ConsumerInjector}
		}
		return "an executor of " + strings.Join(tools, ", "), cons
	}
	return "the next event", nil
}

// resultLine renders one tool result of the timeline.
func resultLine(r toolbus.ToolResult) string {
	line := fmt.Sprintf("        <- %s %s: %s", r.CallID, r.Tool, r.Status)
	if r.Error != nil {
		if r.Error.Code != string(r.Status) { // not "cancelled cancelled"
			line += " " + r.Error.Code
		}
		line += " (" + oneLine(r.Error.Message, 80) + ")"
	}
	line += fmt.Sprintf(" in %d ms on %s", r.DurationMS, r.Executor)
	if r.Truncated != nil {
		line += fmt.Sprintf(" [content truncated %d -> %d bytes]", r.Truncated.OriginalBytes, r.Truncated.KeptBytes)
	}
	return line
}

// print renders one event; it reports the run status and whether the run stopped.
func (p *printer) print(msg jetstream.Msg) (toolbus.RunStatus, bool) {
	meta, err := events.DecodeMsg(msg, nil)
	if err != nil {
		fmt.Fprintf(p.out, "  ? undecodable message on %s: %v\n", msg.Subject(), err)
		return "", false
	}
	p.last = meta.Type
	switch meta.Type {
	case events.TypeRunStarted:
		var rs toolbus.RunStarted
		if _, err := events.DecodeMsg(msg, &rs); err == nil {
			q := ""
			for _, m := range rs.Messages {
				if m.Role == toolbus.RoleUser {
					q = m.Content
				}
			}
			// rs.Model is what this client's TOOLBUS_MODEL asked for; the planner answers
			// with its own model, which its first answer names.
			fmt.Fprintf(p.out, "run %s started: %q\n", rs.RunID, q)
		}
	case events.TypeModelResponded:
		var mr toolbus.ModelResponded
		if _, err := events.DecodeMsg(msg, &mr); err == nil {
			if mr.Model != "" && mr.Model != p.model {
				p.model = mr.Model
				fmt.Fprintf(p.out, "model %s (the planner's)\n", mr.Model)
			}
			clear(p.open)
			for _, c := range mr.Message.ToolCalls {
				p.open[c.CallID] = c.Tool
			}
			text := oneLine(mr.Message.Content, 100)
			if len(mr.Message.ToolCalls) == 0 {
				fmt.Fprintf(p.out, "step %d  model answered (%d ms)\n", mr.Step, mr.LatencyMS)
			} else {
				fmt.Fprintf(p.out, "step %d  model asked for %d call(s) (%d ms)", mr.Step, len(mr.Message.ToolCalls), mr.LatencyMS)
				if text != "" {
					fmt.Fprintf(p.out, ": %s", text)
				}
				fmt.Fprintln(p.out)
				for _, c := range mr.Message.ToolCalls {
					fmt.Fprintf(p.out, "        -> %s %s(%s)\n", c.CallID, c.Tool, oneLine(c.Arguments, 80))
				}
			}
		}
	case events.TypeToolFinished:
		var tf toolbus.ToolFinished
		if _, err := events.DecodeMsg(msg, &tf); err == nil {
			delete(p.open, tf.CallID)
			fmt.Fprintln(p.out, resultLine(tf.ToolResult))
		}
	case events.TypeToolWaiting:
		var tw toolbus.ToolWaiting
		if _, err := events.DecodeMsg(msg, &tw); err == nil {
			fmt.Fprintf(p.out, "        .. %s %s waits for approval\n", tw.Call.CallID, tw.Call.Tool)
		}
	case events.TypeApprovalGranted, events.TypeApprovalDenied:
		var a toolbus.Approval
		if _, err := events.DecodeMsg(msg, &a); err == nil {
			fmt.Fprintf(p.out, "        %s %s by %s %s\n", strings.TrimPrefix(meta.Type, "toolbus."), a.CallID, a.Who, a.Why)
		}
	case events.TypeRunCancel:
		fmt.Fprintln(p.out, "cancel requested")
	default:
		if strings.HasPrefix(meta.Type, "toolbus.run.") {
			var re toolbus.RunEnded
			if _, err := events.DecodeMsg(msg, &re); err == nil {
				fmt.Fprintf(p.out, "run %s: %s after %d step(s), %d tokens", re.RunID, re.Status, re.StepsUsed, re.Usage.Total())
				if re.Code != "" {
					fmt.Fprintf(p.out, " [%s]", re.Code)
				}
				fmt.Fprintln(p.out)
				if re.Reason != "" {
					fmt.Fprintf(p.out, "reason: %s\n", re.Reason)
				}
				for _, c := range re.Pending {
					fmt.Fprintf(p.out, "pending: %s %s(%s)\n", c.CallID, c.Tool, oneLine(c.Arguments, 80))
				}
				if re.Answer != "" {
					fmt.Fprintf(p.out, "answer: %s\n", re.Answer)
				}
				return re.Status, re.Status != toolbus.RunRunning
			}
		}
	}
	return "", false
}

func oneLine(s string, n int) string {
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
