package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/timeline"
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
	c, err := node.Open(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Server != nil {
		stop, err := node.StartInProcess(ctx, cfg, c, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	tc, err := callrun.Contract(ctx, c.Bus, req.tool)
	if err != nil {
		return callRefusal("call: ", err)
	}
	rs := callrun.Build(callrun.Spec{
		RunID: req.runID, Principal: toolbus.Principal{ID: req.principal}, Tool: tc, Arguments: req.args, Via: "toolbus call",
		Deadline: req.timeout, ApprovalTimeout: max(cfg.RunTimeout, 10*time.Minute),
	}, time.Now())
	watch, err := runlog.Watch(ctx, c.Bus, events.SubjectRun(rs.RunID), true)
	if err != nil {
		return fmt.Errorf("call: %w", err)
	}
	if err := c.Bus.StartRun(ctx, events.Source("cli", cfg.Instance), rs); err != nil {
		if errors.Is(err, events.ErrRunExists) {
			return &exitError{code: callrun.ExitUsage, msg: fmt.Sprintf("call: run id %q already exists; choose another id", rs.RunID)}
		}
		return fmt.Errorf("call: %w", err)
	}
	o, err := callrun.Await(ctx, watch, waitHint, func(p *timeline.Printer) {
		// Silent for a while: say what the call waits for (no planner, no executor...).
		fmt.Fprintln(errOut, strings.TrimSpace(timeline.WaitingHint(ctx, c.Bus, p)))
	}, func(tp toolbus.ToolProgress) {
		// A long call's reports, on stderr as tail shows them: stdout keeps the output.
		fmt.Fprintf(errOut, ".. %s %s\n", req.tool, audit.ProgressText(tp))
	})
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: 130, msg: "interrupted; the call goes on: toolbus cancel " + rs.RunID}
		}
		return fmt.Errorf("call: %w", err)
	}
	return req.report(out, rs.RunID, o)
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
	fs.StringVar(&req.principal, "principal", who(""), "principal the run acts for (default: $USER; in a client account its identity)")
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
		return req, &exitError{code: callrun.ExitUsage, msg: fmt.Sprintf("call: the arguments are not JSON: %s", audit.OneLine(req.args, 80))}
	}
	if !toolbus.ValidToolName(req.tool) {
		return req, &exitError{code: callrun.ExitUsage, msg: fmt.Sprintf("call: invalid tool name %q", req.tool)}
	}
	if req.runID == "" {
		req.runID = callrun.NewID("call")
	}
	if !toolbus.ValidRunID(req.runID) {
		return req, &exitError{code: callrun.ExitUsage, msg: fmt.Sprintf("call: invalid run id %q: use %s", req.runID, toolbus.IDShape)}
	}
	return req, nil
}

// report prints the call's result (or what it waits for) and returns its exit code.
func (req callRequest) report(out io.Writer, run string, o callrun.Outcome) error {
	res, ended := o.Result, o.Ended
	switch {
	case o.Waiting:
		fmt.Fprintf(out, "%s needs approval: %s; toolbus replay %s shows the result\n", req.tool, decide.ApproveCommand(run, callrun.CallID), run)
		return &exitError{code: callrun.ExitApproval}
	case res == nil:
		msg := fmt.Sprintf("run %s ended %s before the call answered", run, ended.Status)
		if ended.Code != "" || ended.Reason != "" {
			msg += ": " + strings.TrimSpace(ended.Code+" "+ended.Reason)
		}
		return &exitError{code: callrun.ExitFailed, msg: msg}
	}
	if req.asJSON {
		if err := timeline.WriteJSON(out, struct {
			RunID  string             `json:"run_id"`
			Result toolbus.ToolResult `json:"result"`
		}{run, *res}); err != nil {
			return err
		}
	} else if res.Status == toolbus.StatusSucceeded {
		callrun.WriteOutput(out, *res)
	}
	code := callrun.ExitCode(res.Status)
	if code == callrun.ExitSucceeded {
		return nil
	}
	msg := fmt.Sprintf("%s %s", req.tool, res.Status)
	if res.Error != nil {
		msg += fmt.Sprintf(" (%s): %s", res.Error.Code, audit.OneLine(res.Error.Message, 200))
	}
	return &exitError{code: code, msg: msg + "; toolbus replay " + run + " shows the run"}
}

// stdinOf is where `toolbus call -` reads its arguments (tests replace it).
var stdinOf io.Reader = os.Stdin

// callRefusal turns a request refused before anything was published
// (callrun.RefusedError) into exit 2, prefixed with the command.
func callRefusal(cmd string, err error) error {
	var refused *callrun.RefusedError
	if errors.As(err, &refused) {
		return &exitError{code: callrun.ExitUsage, msg: cmd + refused.Msg}
	}
	return fmt.Errorf("%s%w", cmd, err)
}
