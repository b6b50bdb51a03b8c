package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/follow"
	"github.com/toolbus/toolbus/timeline"
)

// The operator's commands: approve, deny, cancel, runs and tail. They talk to a running
// pipeline through TOOLBUS_NATS_URL (runs and tail, like replay, can also read the local
// store of the embedded server).

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

// who names the person acting: --who, else in a client account the identity it reads
// as (TOOLBUS_NATS_READ_PREFIX), else $USER, else the account of the process (os/user:
// containers and cron jobs often run without $USER), else its uid.
func who(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if id := events.ReadIdentity(os.Getenv("TOOLBUS_NATS_READ_PREFIX")); id != "" {
		return id
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
	by := fs.String("who", "", "who decides (default $USER; in a client account its identity)")
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
	a.Who = who(*by)
	c, err := node.OpenAs(ctx, cfg, log, a.Who)
	if err != nil {
		return err
	}
	defer c.Close()
	step, call, err := waitingCall(ctx, c.Bus, run, callID, *stepFlag)
	if err != nil {
		return err
	}
	if a.Arguments != "" {
		if err := refusal(decide.CheckEdit(ctx, c.Bus, call, a.Arguments)); err != nil {
			return err
		}
	}
	policyNote(ctx, c.Bus, run, a.Who, errOut)
	granted := kind == "approve"
	ack, err := c.Bus.PublishApproval(ctx, events.Source("cli", cfg.Instance), step, a, granted)
	if err != nil {
		return err
	}
	verb := map[string]string{toolbus.DecisionApproved: "approved", toolbus.DecisionEdited: "approved with edited arguments",
		toolbus.DecisionRejected: "denied", toolbus.DecisionResponded: "answered in the tool's place"}[a.Kind(granted)]
	fmt.Fprintf(out, "%s call %s %s(%s) of run %s, step %d, by %s", verb, call.CallID, call.Tool, audit.OneLine(call.Arguments, 60), run, step, a.Who)
	if a.Why != "" {
		fmt.Fprintf(out, ": %s", a.Why)
	}
	fmt.Fprintln(out)
	if ack.Duplicate {
		fmt.Fprintln(out, "(the same decision was already published; nothing changes)")
	}
	switch a.Kind(granted) {
	case toolbus.DecisionEdited:
		fmt.Fprintf(out, "the call runs with %s and the run goes on: toolbus tail %s\n", audit.OneLine(a.Arguments, 60), run)
	case toolbus.DecisionApproved:
		fmt.Fprintf(out, "the call runs and the run goes on: toolbus tail %s\n", run)
	case toolbus.DecisionResponded:
		fmt.Fprintf(out, "the tool does not run; the model reads the answer as the call's result: toolbus tail %s\n", run)
	default:
		fmt.Fprintf(out, "the model reads the denial (approval_denied) and goes on: toolbus tail %s\n", run)
	}
	return nil
}

// policyNote tells errOut when run does not name who as a decider (decide.PolicyNote).
func policyNote(ctx context.Context, bus *events.Bus, run, who string, errOut io.Writer) {
	if note := decide.PolicyNote(ctx, bus, run, who); note != "" {
		fmt.Fprintln(errOut, note)
	}
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
	by := fs.String("who", "", "who cancels (default $USER; in a client account its identity)")
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
	c, err := node.OpenAs(ctx, cfg, log, who(*by))
	if err != nil {
		return err
	}
	defer c.Close()
	st, _, err := c.Bus.Store().RunState(ctx, run)
	if err != nil {
		if errors.Is(err, events.ErrRunNotFound) {
			return &exitError{code: 1, msg: fmt.Sprintf("run %s not found", run)}
		}
		return err
	}
	if st.Status.Terminal() {
		return &exitError{code: 1, msg: fmt.Sprintf("run %s already ended: %s", run, st.Status)}
	}
	policyNote(ctx, c.Bus, run, who(*by), errOut)
	ack, err := c.Bus.PublishCancel(ctx, events.Source("cli", cfg.Instance), toolbus.Cancel{RunID: run, Reason: *reason, Who: who(*by)})
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
	runs, err := c.Bus.Runs(ctx)
	if err != nil {
		return err
	}
	for i, r := range runs {
		if !r.Status.Terminal() {
			// The run state records the step when a run waits or ends; ask where it is.
			if step, err := c.Bus.Store().CurrentStep(ctx, r.RunID); err == nil {
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
	calls := make(map[string]audit.Calls, len(runs))
	for _, r := range runs {
		if calls[r.RunID], err = audit.CountCalls(ctx, c.Bus, r.RunID); err != nil {
			return err
		}
	}
	return timeline.WriteRuns(out, runs, calls, time.Now(), *asJSON)
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
		colour = timeline.IsTerminal(out) && os.Getenv("NO_COLOR") == ""
	case "always":
		colour = true
	case "never":
	default:
		return usageError(fs, "tail: --color is auto, always or never")
	}
	c, err := openReader(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer c.Close()
	// The local store of the embedded server (no TOOLBUS_NATS_URL) has no writer but
	// this process: tail shows what it holds, from the start, and stops at its end.
	local := c.Server != nil
	if local {
		*all = true
		fmt.Fprintf(errOut, "reading the local store %s (no TOOLBUS_NATS_URL): its stored events, then tail stops; set TOOLBUS_NATS_URL to follow a running server live\n",
			filepath.Join(cfg.DataDir, "jetstream"))
	}
	filter, ended := events.FilterAll, false
	if run != "" {
		filter = events.SubjectRun(run)
		st, _, err := c.Bus.Store().RunState(ctx, run)
		// A run ended before tail began is shown whole, a timer stored after its outcome too.
		ended = err == nil && st.Status.Terminal()
		switch {
		case errors.Is(err, events.ErrRunNotFound) && local:
			return &exitError{code: 1, msg: fmt.Sprintf("run %s not found in the local store %s", run, filepath.Join(cfg.DataDir, "jetstream"))}
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
	watch, err := follow.Tail(ctx, c.Bus, run, filter, *all)
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	if run == "" && !*all {
		fmt.Fprintln(errOut, "following every run from now on (Ctrl-C stops)")
	}
	t := &timeline.Tailer{Out: out, Colour: colour, PrefixRun: run == ""}
	for {
		ev, ok, err := watch.Next(ctx, time.Second)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil // interrupted (the normal way to stop following), or the run ended
			}
			return fmt.Errorf("tail: %w", err)
		}
		if !ok {
			if local || ended {
				return nil // every stored event shown: nothing else will come
			}
			continue
		}
		if status := t.Print(ev); run != "" && status.Terminal() && !ended {
			return nil
		}
	}
}
