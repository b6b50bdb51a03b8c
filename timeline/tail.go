package timeline

import (
	"bytes"
	"io"
	"os"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// IsTerminal reports whether w is a character device (a terminal), without new
// dependencies.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// ANSI colours of the tail.
const (
	ansiReset   = "\x1b[0m"
	ansiBold    = "\x1b[1m"
	ansiDim     = "\x1b[2m"
	ansiRed     = "\x1b[31m"
	ansiGreen   = "\x1b[32m"
	ansiYellow  = "\x1b[33m"
	ansiMagenta = "\x1b[35m"
	ansiCyan    = "\x1b[36m"
)

// Tailer renders events with the run timeline printer, coloured by kind and outcome,
// each line prefixed with its run id when several runs are followed.
type Tailer struct {
	// Out is where the lines go.
	Out io.Writer
	// Colour colours the lines (ANSI).
	Colour bool
	// PrefixRun prefixes each line with its run id (several runs followed).
	PrefixRun bool
	buf       bytes.Buffer
	// finished holds the calls seen finishing (run/step/call id), whose late progress
	// reports are ignored; it is forgotten when it grows past maxTailFinished.
	finished map[string]bool
	// printers are the runs' printers: what a run's earlier events said (the model it
	// asked for, the model already named) shapes how its later ones read, as in the
	// timeline of toolbus run. Forgotten when they grow past maxTailRuns.
	printers map[string]*Printer
}

// maxTailFinished bounds the finished calls a tail remembers, maxTailRuns the runs.
const (
	maxTailFinished = 100_000
	maxTailRuns     = 10_000
)

// printer is the printer of the run of ev (one for events of no run).
func (t *Tailer) printer(ev runlog.StoredEvent) *Printer {
	if t.finished == nil || len(t.finished) > maxTailFinished {
		t.finished = map[string]bool{}
	}
	if t.printers == nil || len(t.printers) > maxTailRuns {
		t.printers = map[string]*Printer{}
	}
	run, _ := events.RunIDFromSubject(ev.Subject)
	p, ok := t.printers[run]
	if !ok {
		p = NewPrinter(&t.buf)
		p.Timers = true
		t.printers[run] = p
	}
	p.finished = t.finished
	return p
}

// Print renders one event and returns the run status it reports, if any.
func (t *Tailer) Print(ev runlog.StoredEvent) toolbus.RunStatus {
	t.buf.Reset()
	status, _ := t.printer(ev).Print(ev)
	text := strings.TrimRight(t.buf.String(), "\n")
	if text == "" {
		return status
	}
	colour := ""
	if t.Colour {
		colour = eventColour(ev, status)
	}
	prefix := ""
	if t.PrefixRun {
		if run, ok := events.RunIDFromSubject(ev.Subject); ok {
			prefix = run + " "
			if t.Colour {
				prefix = ansiDim + prefix + ansiReset
			}
		}
	}
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		b.WriteString(prefix)
		if colour != "" {
			b.WriteString(colour + line + ansiReset)
		} else {
			b.WriteString(line)
		}
		b.WriteByte('\n')
	}
	_, _ = io.WriteString(t.Out, b.String())
	return status
}

// eventColour picks the colour of an event: outcomes by status, results green when they
// succeeded and red when not, the model cyan, approvals and cancellation yellow.
func eventColour(ev runlog.StoredEvent, status toolbus.RunStatus) string {
	if status != "" {
		switch status {
		case toolbus.RunCompleted:
			return ansiBold + ansiGreen
		case toolbus.RunFailed:
			return ansiBold + ansiRed
		case toolbus.RunLimitReached:
			return ansiBold + ansiMagenta
		}
		return ansiBold + ansiYellow
	}
	subject := ev.Subject
	switch {
	case strings.Contains(subject, ".tool.finished."):
		var tf toolbus.ToolFinished
		if err := ev.Decode(&tf); err == nil && tf.ToolResult.Status == toolbus.StatusSucceeded {
			return ansiGreen
		}
		return ansiRed
	case strings.Contains(subject, ".tool.progress."), strings.Contains(subject, ".tool.log."):
		return ansiDim
	case strings.Contains(subject, ".model.responded"):
		return ansiCyan
	case strings.Contains(subject, ".run.started."):
		return ansiBold
	}
	return ansiYellow
}
