package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/callrun"
)

// The exit codes of `toolbus call`: the status of the tool's result.
const (
	callExitSucceeded = 0
	callExitFailed    = 1 // failed, or the run ended without a result
	callExitUsage     = 2 // bad flags or JSON, unknown tool
	callExitApproval  = 3 // the call waits for approval (as toolbus run)
	callExitRejected  = 4 // rejected: invalid arguments, not authorized, denied
	callExitTimedOut  = 5
	callExitCancelled = 6
)

const callHelp = `usage: toolbus call <tool> ['<json arguments>' | -] [flags]
  call one tool through the fleet, as a pre-planned run (audited like any other:
  toolbus replay <run>; the executor applies the allowlist, approval and timeout; no model
  is called), and print its output (JSON pretty-printed, else the text the model reads).
  The arguments default to {}; - reads them from stdin. With no TOOLBUS_NATS_URL the
  executor runs in this process on the embedded server (TOOLBUS_TOOLS packs).
  Exit: 0 succeeded, 1 failed (or the run ended without a result), 2 usage or unknown
  tool, 3 waits for approval, 4 rejected, 5 timed out, 6 cancelled, 130 interrupted.
`

// cmdCall runs one tool call as a pre-planned run and prints its result.
func cmdCall(ctx context.Context, cfg Config, log *slog.Logger, args []string, stdin io.Reader, out, errOut io.Writer) error {
	req, err := parseCall(args, stdin, errOut)
	if err != nil {
		return err
	}
	if cfg.URL == "" {
		// The in-process planner only records the pre-planned step: it never calls a
		// model, so it needs no key whatever TOOLBUS_MODEL says.
		cfg.Model = "script:noop"
	}
	c, err := openBus(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer c.Close()
	if c.srv != nil {
		stop, err := startInProcess(ctx, cfg, c, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	cat, err := c.bus.Store().WatchCatalog(ctx, nil)
	if err != nil {
		return fmt.Errorf("call: catalog: %w", err)
	}
	tc, ok := cat.Lookup(req.tool)
	if !ok {
		return &exitError{code: callExitUsage, msg: "call: " + unknownToolMessage(req.tool, cat)}
	}
	rs := callrun.Build(callrun.Spec{
		RunID: req.runID, Principal: toolbus.Principal{ID: req.principal}, Tool: tc, Arguments: req.args, Via: "toolbus call",
		Deadline: req.timeout, ApprovalTimeout: max(cfg.RunTimeout, 10*time.Minute),
	}, time.Now())
	watch, err := c.bus.Watch(ctx, events.SubjectRun(rs.RunID), true)
	if err != nil {
		return fmt.Errorf("call: %w", err)
	}
	if err := c.bus.StartRun(ctx, events.Source("cli", cfg.Instance), rs); err != nil {
		if errors.Is(err, events.ErrRunExists) {
			return &exitError{code: callExitUsage, msg: fmt.Sprintf("call: run id %q already exists; choose another id", rs.RunID)}
		}
		return fmt.Errorf("call: %w", err)
	}
	res, ended, waiting, err := awaitCall(ctx, watch, rs.RunID, func(p *printer) {
		// Silent for a while: say what the call waits for (no planner, no executor...).
		fmt.Fprintln(errOut, strings.TrimSpace(waitingHint(ctx, c.bus, p)))
	})
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: 130, msg: "interrupted; the call goes on: toolbus cancel " + rs.RunID}
		}
		return fmt.Errorf("call: %w", err)
	}
	return req.report(out, rs.RunID, res, ended, waiting)
}

// callRequest is what toolbus call was asked: the tool, its arguments (JSON text) and
// the run's settings.
type callRequest struct {
	tool, args       string
	runID, principal string
	timeout          time.Duration
	asJSON           bool
}

// parseCall reads the flags, the tool and its arguments (from stdin for "-").
func parseCall(args []string, stdin io.Reader, errOut io.Writer) (callRequest, error) {
	fs := newFlagSet("call", "call <tool> ['<json>' | -] [flags]", errOut)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), callHelp)
		fs.PrintDefaults()
	}
	var req callRequest
	fs.BoolVar(&req.asJSON, "json", false, "print the run id and the whole tool result as JSON")
	fs.StringVar(&req.principal, "principal", "cli", "principal the run acts for")
	fs.StringVar(&req.runID, "id", "", "run id (default: call-<random>)")
	fs.DurationVar(&req.timeout, "timeout", 0, "run deadline from now (default: the tool's timeout plus 15s; approval: TOOLBUS_RUN_TIMEOUT)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return req, flagError(err)
	}
	if len(pos) < 1 || len(pos) > 2 {
		return req, usageError(fs, `call: give the tool and its JSON arguments, e.g. toolbus call calculator '{"expression":"6*7"}'`)
	}
	req.tool, req.args = pos[0], "{}"
	if len(pos) == 2 {
		req.args = pos[1]
	}
	if req.args == "-" {
		b, err := io.ReadAll(stdin)
		if err != nil {
			return req, fmt.Errorf("call: read arguments: %w", err)
		}
		req.args = string(b)
	}
	if req.args = strings.TrimSpace(req.args); req.args == "" {
		req.args = "{}"
	}
	if !json.Valid([]byte(req.args)) {
		return req, &exitError{code: callExitUsage, msg: fmt.Sprintf("call: the arguments are not JSON: %s", oneLine(req.args, 80))}
	}
	if !toolbus.ValidToolName(req.tool) {
		return req, &exitError{code: callExitUsage, msg: fmt.Sprintf("call: invalid tool name %q", req.tool)}
	}
	if req.runID == "" {
		req.runID = "call-" + strings.TrimPrefix(newRunID(), "run-")
	}
	if !toolbus.ValidRunID(req.runID) {
		return req, &exitError{code: callExitUsage, msg: fmt.Sprintf("call: invalid run id %q: use 1-128 of [A-Za-z0-9_-]", req.runID)}
	}
	return req, nil
}

// report prints the call's result (or what it waits for) and returns its exit code.
func (req callRequest) report(out io.Writer, run string, res *toolbus.ToolResult, ended toolbus.RunEnded, waiting bool) error {
	switch {
	case waiting:
		fmt.Fprintf(out, "%s needs approval: toolbus approve %s %s (or toolbus deny %s %s --reason ...); toolbus replay %s shows the result\n",
			req.tool, run, callrun.CallID, run, callrun.CallID, run)
		return &exitError{code: callExitApproval}
	case res == nil:
		msg := fmt.Sprintf("run %s ended %s before the call answered", run, ended.Status)
		if ended.Code != "" || ended.Reason != "" {
			msg += ": " + strings.TrimSpace(ended.Code+" "+ended.Reason)
		}
		return &exitError{code: callExitFailed, msg: msg}
	}
	if req.asJSON {
		if err := writeJSON(out, struct {
			RunID  string             `json:"run_id"`
			Result toolbus.ToolResult `json:"result"`
		}{run, *res}); err != nil {
			return err
		}
	} else if res.Status == toolbus.StatusSucceeded {
		writeOutput(out, *res)
	}
	code := callExitCode(res.Status)
	if code == callExitSucceeded {
		return nil
	}
	msg := fmt.Sprintf("%s %s", req.tool, res.Status)
	if res.Error != nil {
		msg += fmt.Sprintf(" (%s): %s", res.Error.Code, oneLine(res.Error.Message, 200))
	}
	return &exitError{code: code, msg: msg + "; toolbus replay " + run + " shows the run"}
}

// awaitCall follows a call run until it ends (the result is the tool.finished of its
// call) or its call waits for approval; after waitHint of silence it calls hint once per
// silence with a printer that knows what the run waits for.
func awaitCall(ctx context.Context, watch *events.Watcher, run string, hint func(*printer)) (res *toolbus.ToolResult, ended toolbus.RunEnded, waiting bool, err error) {
	done := false
	p := newPrinter(io.Discard)
	idleSince, hinted := time.Now(), false
	v := audit.Visitor{
		ToolFinished: func(_ events.StoredEvent, tf toolbus.ToolFinished) {
			if tf.CallID == callrun.CallID {
				r := tf.ToolResult
				res = &r
			}
		},
		ToolWaiting: func(events.StoredEvent, toolbus.ToolWaiting) { waiting, done = true, true },
		RunEnded: func(_ events.StoredEvent, re toolbus.RunEnded) {
			if re.Status.Terminal() || re.Status == toolbus.RunWaitingForApproval {
				ended, done = re, true
			}
		},
	}
	for !done {
		ev, ok, err := watch.Next(ctx, time.Second)
		if err != nil {
			return nil, ended, false, err
		}
		if !ok {
			if !hinted && time.Since(idleSince) >= waitHint {
				hinted = true
				hint(p)
			}
			continue
		}
		idleSince, hinted = time.Now(), false
		p.print(ev)
		v.Visit(ev)
	}
	if ended.Status == toolbus.RunWaitingForApproval {
		waiting = true
	}
	return res, ended, waiting, nil
}

// callExitCode maps a result status to the exit code of `toolbus call`.
func callExitCode(s toolbus.Status) int {
	switch s {
	case toolbus.StatusSucceeded:
		return callExitSucceeded
	case toolbus.StatusRejected:
		return callExitRejected
	case toolbus.StatusTimedOut:
		return callExitTimedOut
	case toolbus.StatusCancelled:
		return callExitCancelled
	}
	return callExitFailed
}

// writeOutput prints a result's output: JSON indented, else the text the model reads.
func writeOutput(out io.Writer, r toolbus.ToolResult) {
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

// unknownToolMessage says that no executor serves tool and lists the catalog.
func unknownToolMessage(tool string, cat *store.Catalog) string {
	var known []string
	for _, tc := range cat.Tools(nil) {
		known = append(known, tc.Name)
	}
	sort.Strings(known)
	if len(known) == 0 {
		return fmt.Sprintf("unknown tool %q: the catalog is empty (is an executor running?)", tool)
	}
	return fmt.Sprintf("unknown tool %q: no executor serves it; the catalog has %s", tool, strings.Join(known, ", "))
}

// startInProcess runs the executor, planner and injector on the embedded bus of c until
// the returned stop is called, once the executor has published its tools.
func startInProcess(ctx context.Context, cfg Config, c *conn, log *slog.Logger) (stop func(), err error) {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runRoles(wctx, cfg, c.bus, log, "executor", "planner", "injector") }()
	stop = func() {
		cancel()
		<-done
	}
	if err := waitForCatalog(ctx, c.bus, done); err != nil {
		cancel()
		return nil, err
	}
	return stop, nil
}

// stdinOf is where `toolbus call -` reads its arguments (tests replace it).
var stdinOf io.Reader = os.Stdin
