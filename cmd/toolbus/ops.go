package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/decide"
)

// The operator's commands: approve, deny, cancel, runs and tail. They talk to a running
// pipeline through TOOLBUS_NATS_URL (runs, like replay, can also read the local store of
// the embedded server).

// defaultLimits are the limits the workers give runs that set none.
func (c Config) defaultLimits() toolbus.DefaultLimits {
	return toolbus.DefaultLimits{MaxSteps: c.MaxSteps, RunTimeout: c.RunTimeout, TokenBudget: c.TokenBudget, MaxRunTimeout: c.MaxRunTimeout}
}

// parseInterleaved parses flags that may come before, between or after the positional
// arguments (toolbus deny run-1 call_1 --reason "..."), and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil // everything after -- is positional
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// newFlagSet is the flag set of a command. Every command takes -v (read by run before
// the command starts: see verbose); the flag is defined here so that it parses and shows
// in the command's help.
func newFlagSet(name, synopsis string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Bool("v", false, "verbose: log the connection and the workers' activity on stderr (as TOOLBUS_LOG_LEVEL=info)")
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: toolbus %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// flagError is the exit of a command whose flags did not parse (the flag package has
// already printed why); -h is not an error.
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return &exitError{code: 0}
	}
	return &exitError{code: 2}
}

func usageError(fs *flag.FlagSet, msg string) error {
	fs.Usage()
	return &exitError{code: 2, msg: msg}
}

// who names the person acting: --who, else $USER, else the account of the process
// (os/user: containers and cron jobs often run without $USER), else its uid.
func who(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "uid:" + strconv.Itoa(os.Getuid())
}

// cmdDecide publishes a person's decision on a call that waits for approval in the
// run's current step: approve (approval.granted, with --args an edit of the arguments),
// deny (approval.denied; the model reads --message) or respond (approval.denied with a
// response: the tool does not run and the answer is the call's result).
func cmdDecide(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer, kind string) error {
	name, synopsis := kind, map[string]string{
		"approve": "approve <run> <call_id> [--args '{...}'] [--reason text] [--step n] [--who name]",
		"deny":    "deny <run> <call_id> --message text [--step n] [--who name]",
		"respond": "respond <run> <call_id> (--answer text | <answer>) [--step n] [--who name]",
	}[kind]
	fs := newFlagSet(name, synopsis, errOut)
	reasonHelp := "why (kept with the decision in the audit record)"
	if kind == "deny" {
		reasonHelp = "why (required: the model reads it); the same as --message"
	}
	reason := fs.String("reason", "", reasonHelp)
	var message, answer, edited *string
	switch kind {
	case "approve":
		edited = fs.String("args", "", "run the call with these arguments instead of the model's (one JSON object, checked against the tool's input schema)")
	case "deny":
		message = fs.String("message", "", "what the model reads (required)")
	case "respond":
		answer = fs.String("answer", "", "the answer in the tool's place: the call's result, which the model reads")
	}
	stepFlag := fs.Int("step", -1, "the step of the call (refused unless it is the run's current step)")
	by := fs.String("who", "", "who decides (default $USER)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if kind == "respond" && len(pos) == 3 && *answer == "" {
		*answer, pos = pos[2], pos[:2]
	}
	if len(pos) != 2 {
		return usageError(fs, name+": give the run id and the call id")
	}
	run, callID := pos[0], pos[1]
	if !toolbus.ValidRunID(run) {
		return &exitError{code: 2, msg: fmt.Sprintf("%s: invalid run id %q", name, run)}
	}
	a := toolbus.Approval{RunID: run, CallID: callID, Why: *reason}
	switch kind {
	case "approve":
		a.Arguments = strings.TrimSpace(*edited)
	case "deny":
		if *message != "" && a.Why != "" && *message != a.Why {
			return usageError(fs, "deny: give --message or --reason, not both")
		}
		a.Why = cmp.Or(*message, a.Why)
		if strings.TrimSpace(a.Why) == "" {
			return usageError(fs, "deny: --reason is required (or --message): the model reads it")
		}
	case "respond":
		a.Response = *answer
		if strings.TrimSpace(a.Response) == "" {
			return usageError(fs, "respond: give the answer (--answer text): the model reads it as the call's result")
		}
	}
	c, err := openBus(ctx, cfg, log, false)
	if err != nil {
		return err
	}
	defer c.Close()

	step, call, err := waitingCall(ctx, c.bus, run, callID, *stepFlag)
	if err != nil {
		return err
	}
	if a.Arguments != "" {
		if err := refusal(decide.CheckEdit(ctx, c.bus, call, a.Arguments)); err != nil {
			return err
		}
	}
	a.Who = who(*by)
	granted := kind == "approve"
	ack, err := c.bus.PublishApproval(ctx, events.Source("cli", cfg.Instance), step, a, granted)
	if err != nil {
		return err
	}
	verb := map[string]string{toolbus.DecisionApproved: "approved", toolbus.DecisionEdited: "approved with edited arguments",
		toolbus.DecisionRejected: "denied", toolbus.DecisionResponded: "answered in the tool's place"}[a.Kind(granted)]
	fmt.Fprintf(out, "%s call %s %s(%s) of run %s, step %d, by %s", verb, call.CallID, call.Tool, oneLine(call.Arguments, 60), run, step, a.Who)
	if a.Why != "" {
		fmt.Fprintf(out, ": %s", a.Why)
	}
	fmt.Fprintln(out)
	if ack.Duplicate {
		fmt.Fprintln(out, "(the same decision was already published; nothing changes)")
	}
	switch a.Kind(granted) {
	case toolbus.DecisionEdited:
		fmt.Fprintf(out, "the call runs with %s and the run goes on: toolbus tail %s\n", oneLine(a.Arguments, 60), run)
	case toolbus.DecisionApproved:
		fmt.Fprintf(out, "the call runs and the run goes on: toolbus tail %s\n", run)
	case toolbus.DecisionResponded:
		fmt.Fprintf(out, "the tool does not run; the model reads the answer as the call's result: toolbus tail %s\n", run)
	default:
		fmt.Fprintf(out, "the model reads the denial (approval_denied) and goes on: toolbus tail %s\n", run)
	}
	return nil
}

// statusList is statuses separated by commas.
func statusList(statuses []toolbus.RunStatus) string {
	s := make([]string, len(statuses))
	for i, st := range statuses {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

// waitingCall finds the call callID that waits for a decision in the run's current step
// (decide.Waiting); a refusal of the run's state exits 1.
func waitingCall(ctx context.Context, bus *events.Bus, run, callID string, step int) (int, toolbus.ToolCall, error) {
	step, call, err := decide.WaitingAt(ctx, bus, run, callID, step)
	return step, call, refusal(err)
}

// refusal turns a decision the run's state refuses (decide.RefusedError) into exit 1.
func refusal(err error) error {
	var refused *decide.RefusedError
	if errors.As(err, &refused) {
		return &exitError{code: 1, msg: refused.Msg}
	}
	return err
}

// cmdCancel publishes run.cancel: every executor cancels the run's calls in flight and
// the run ends cancelled.
func cmdCancel(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("cancel", "cancel <run> [--reason text] [--who name]", errOut)
	reason := fs.String("reason", "", "why")
	by := fs.String("who", "", "who cancels (default $USER)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) != 1 {
		return usageError(fs, "cancel: give the run id")
	}
	run := pos[0]
	if !toolbus.ValidRunID(run) {
		return &exitError{code: 2, msg: fmt.Sprintf("cancel: invalid run id %q", run)}
	}
	c, err := openBus(ctx, cfg, log, false)
	if err != nil {
		return err
	}
	defer c.Close()
	st, _, err := c.bus.Store().RunState(ctx, run)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return &exitError{code: 1, msg: fmt.Sprintf("run %s not found", run)}
		}
		return err
	}
	if st.Status.Terminal() {
		return &exitError{code: 1, msg: fmt.Sprintf("run %s already ended: %s", run, st.Status)}
	}
	ack, err := c.bus.PublishCancel(ctx, events.Source("cli", cfg.Instance), toolbus.Cancel{RunID: run, Reason: *reason, Who: who(*by)})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cancel requested for run %s (%s)", run, st.Status)
	if *reason != "" {
		fmt.Fprintf(out, ": %s", *reason)
	}
	fmt.Fprintln(out)
	if ack.Duplicate {
		fmt.Fprintln(out, "(a cancel was already requested)")
	}
	return nil
}

// cmdRuns lists the runs of the runs bucket, newest first.
func cmdRuns(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("runs", "runs [--json] [--status s]", errOut)
	asJSON := fs.Bool("json", false, "print JSON")
	status := fs.String("status", "", "only runs with this status")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) != 0 {
		return usageError(fs, "runs: no arguments expected")
	}
	if *status != "" && !slices.Contains(toolbus.RunStatuses, toolbus.RunStatus(*status)) {
		return &exitError{code: 2, msg: fmt.Sprintf("runs: unknown status %q: want one of %s", *status, statusList(toolbus.RunStatuses))}
	}
	c, err := openReader(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer c.Close()
	runs, err := c.bus.Store().Runs(ctx)
	if err != nil {
		return err
	}
	for i, r := range runs {
		if !r.Status.Terminal() {
			// The run state records the step when a run waits or ends; ask where it is.
			if step, err := c.bus.Store().CurrentStep(ctx, r.RunID); err == nil {
				runs[i].Step = step
			}
		}
	}
	if *status != "" {
		kept := runs[:0]
		for _, r := range runs {
			if string(r.Status) == *status {
				kept = append(kept, r)
			}
		}
		runs = kept
	}
	return writeRuns(out, runs, time.Now(), *asJSON)
}

// writeRuns prints run states newest first, as a table or as JSON.
func writeRuns(out io.Writer, runs []store.RunState, now time.Time, asJSON bool) error {
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
		return writeJSON(out, rows)
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s ago\t%s\n", r.RunID, r.Status, r.Step, age(now.Sub(r.StartedAt)),
			age(now.Sub(r.UpdatedAt)), oneLine(reason, 60))
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

// age renders a duration the way people read ages: 4s, 3m12s, 5h2m, 3d4h.
func age(d time.Duration) string {
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

// cmdTail follows events live: one run's (and stops when it ends) or every run's.
func cmdTail(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("tail", "tail [run] [--all] [--color auto|always|never]", errOut)
	all := fs.Bool("all", false, "start from the first stored event instead of new events only")
	colorMode := fs.String("color", "auto", "colour: auto (when stdout is a terminal), always or never")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) > 1 {
		return usageError(fs, "tail: at most one run id")
	}
	run := ""
	if len(pos) == 1 {
		run = pos[0]
		if !toolbus.ValidRunID(run) {
			return &exitError{code: 2, msg: fmt.Sprintf("tail: invalid run id %q", run)}
		}
	}
	var colour bool
	switch *colorMode {
	case "auto":
		colour = isTerminal(out) && os.Getenv("NO_COLOR") == ""
	case "always":
		colour = true
	case "never":
	default:
		return usageError(fs, "tail: --color is auto, always or never")
	}
	c, err := openBus(ctx, cfg, log, false)
	if err != nil {
		return err
	}
	defer c.Close()
	filter := events.FilterAll
	if run != "" {
		filter = events.SubjectRun(run)
		st, _, err := c.bus.Store().RunState(ctx, run)
		switch {
		case errors.Is(err, events.ErrRunNotFound):
			// Nothing to skip: follow it from its first event.
			fmt.Fprintf(errOut, "run %s not started yet; waiting for its events\n", run)
			*all = true
		case err != nil:
			return err
		case st.Status.Terminal() && !*all:
			fmt.Fprintf(out, "run %s already ended: %s (toolbus tail --all %s or toolbus replay %s shows its events)\n", run, st.Status, run, run)
			return nil
		}
	}
	watch, err := c.bus.Watch(ctx, filter, *all)
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	if run == "" && !*all {
		fmt.Fprintln(errOut, "following every run from now on (Ctrl-C stops)")
	}
	t := &tailer{out: out, colour: colour, prefixRun: run == ""}
	for {
		ev, ok, err := watch.Next(ctx, time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: the normal way to stop following
			}
			return fmt.Errorf("tail: %w", err)
		}
		if !ok {
			continue
		}
		status := t.print(ev)
		if run != "" && status.Terminal() {
			return nil
		}
	}
}

// isTerminal reports whether w is a character device (a terminal), without new
// dependencies.
func isTerminal(w io.Writer) bool {
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

// tailer renders events with the run timeline printer, coloured by kind and outcome,
// each line prefixed with its run id when several runs are followed.
type tailer struct {
	out       io.Writer
	colour    bool
	prefixRun bool
	buf       bytes.Buffer
	// finished holds the calls seen finishing (run/step/call id), whose late progress
	// reports are ignored; it is forgotten when it grows past maxTailFinished.
	finished map[string]bool
}

// maxTailFinished bounds the finished calls a tail remembers.
const maxTailFinished = 100_000

// print renders one event and returns the run status it reports, if any.
func (t *tailer) print(ev events.StoredEvent) toolbus.RunStatus {
	t.buf.Reset()
	p := newPrinter(&t.buf)
	p.timers = true
	if t.finished == nil || len(t.finished) > maxTailFinished {
		t.finished = map[string]bool{}
	}
	p.finished = t.finished
	status, _ := p.print(ev)
	text := strings.TrimRight(t.buf.String(), "\n")
	if text == "" {
		return status
	}
	colour := ""
	if t.colour {
		colour = eventColour(ev, status)
	}
	prefix := ""
	if t.prefixRun {
		if run, ok := events.RunIDFromSubject(ev.Subject); ok {
			prefix = run + " "
			if t.colour {
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
	_, _ = io.WriteString(t.out, b.String())
	return status
}

// eventColour picks the colour of an event: outcomes by status, results green when they
// succeeded and red when not, the model cyan, approvals and cancellation yellow.
func eventColour(ev events.StoredEvent, status toolbus.RunStatus) string {
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
	case strings.Contains(subject, ".tool.progress."):
		return ansiDim
	case strings.Contains(subject, ".model.responded"):
		return ansiCyan
	case strings.Contains(subject, ".run.started."):
		return ansiBold
	}
	return ansiYellow
}
