package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner/models"
	"github.com/toolbus/toolbus/timeline"
)

// cmdRun submits a run and prints its events live until it ends. With no
// TOOLBUS_NATS_URL it runs the whole pipeline in this process on an embedded server.
func cmdRun(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	rs, err := parseRun(cfg, args, errOut)
	if err != nil {
		return err
	}
	if rs.Model != "" && cfg.URL == "" {
		cfg.Model = rs.Model // the in-process planner's own model is the run's
	}
	if cfg.URL == "" {
		// The in-process planner needs its model: say what is missing (an API key...)
		// before anything starts, not that no executor published its tools.
		if _, err := models.Base(cfg.Model, cfg.ModelOptions()); err != nil {
			return &exitError{code: 2, msg: fmt.Sprintf("run: model %s: %v", cfg.Model, err)}
		}
	}
	c, err := node.Open(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer c.Close()
	wctx, stopWorkers := context.WithCancel(ctx)
	workersDone := make(chan error, 1)
	if c.Server != nil {
		go func() { workersDone <- node.RunRoles(wctx, cfg, c.Bus, log, "executor", "planner", "injector") }()
		if err := node.WaitForCatalog(ctx, c.Bus, workersDone); err != nil {
			stopWorkers()
			return err
		}
	} else {
		workersDone = nil // no in-process workers: nothing to wait for
	}
	f := &runFollower{c: c, run: rs.RunID, out: out, workersDone: workersDone}
	defer func() {
		stopWorkers()
		if f.workersDone != nil {
			<-f.workersDone
		}
	}()

	if err := callrun.CheckAllowed(wctx, c.Bus, rs.AllowedTools); err != nil {
		return callRefusal("run: ", err)
	}
	watch, err := runlog.Watch(ctx, c.Bus, events.SubjectRun(rs.RunID), true)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if err := c.Bus.StartRun(ctx, events.Source("cli", cfg.Instance), rs); err != nil {
		if errors.Is(err, events.ErrRunExists) {
			// A run id names one run forever: it is never replayed nor restarted. The replay
			// hint only for a run these credentials can read: in a client account another
			// identity's run is "not found" to them, and the refusal names nothing of it.
			msg := fmt.Sprintf("run: run id %q already exists; choose another id", rs.RunID)
			if _, err := c.Bus.RunStarted(ctx, rs.RunID); err == nil {
				msg += fmt.Sprintf(" (toolbus replay %s shows that run)", rs.RunID)
			}
			return &exitError{code: 2, msg: msg}
		}
		return err
	}
	return f.follow(ctx, watch)
}

// parseRun reads the flags and the question of toolbus run into the run to start.
func parseRun(cfg Config, args []string, errOut io.Writer) (toolbus.RunStarted, error) {
	fs := newFlagSet("run", `run [flags] "question"   (flags may come before or after the question; -- ends them)`, errOut)
	runID := fs.String("id", "", "run id (default: random)")
	system := fs.String("system", "", "the run's system message (default: none; the model reads only the question)")
	tools := fs.String("tools", "", "comma-separated allowed tools (default: all)")
	maxSteps := fs.Int("max-steps", cmp.Or(cfg.MaxSteps, injector.DefaultMaxSteps), "step limit")
	timeout := fs.Duration("timeout", cfg.RunTimeout, "run deadline from now")
	budget := fs.Int64("token-budget", cfg.TokenBudget, "token budget (0: none)")
	principal := fs.String("principal", who(""), "principal the run acts for (default: $USER, in a client account its identity; whom approve, deny and cancel name too)")
	approvers := fs.String("approvers", "", "comma-separated identities who may decide on and cancel the run besides its principal")
	model := fs.String("model", "", "model of this run, e.g. script:./greet.json (a script file here travels with the run, up to 64 KiB) or openai:gpt-4.1 (default: the planner's TOOLBUS_MODEL); a planner that cannot serve it fails the run saying why")
	// Flags may follow the question (toolbus run "q" --max-steps 1): they are flags, not
	// words of the question; a question that starts with "-" comes after "--".
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return toolbus.RunStarted{}, flagError(err)
	}
	question := strings.Join(pos, " ")
	if strings.TrimSpace(question) == "" {
		return toolbus.RunStarted{}, &exitError{code: 2, msg: `run: give the question, e.g. toolbus run "What is going on with INC-404?"`}
	}
	if *runID == "" {
		*runID = callrun.NewID("run")
	}
	// A script file of this host travels with the run: the planner may be on another.
	shipped, err := models.Ship(*model)
	if err != nil {
		return toolbus.RunStarted{}, &exitError{code: 2, msg: fmt.Sprintf("run: --model %s: %v", *model, err)}
	}
	*model = shipped
	if !toolbus.ValidRunID(*runID) {
		return toolbus.RunStarted{}, &exitError{code: 2, msg: fmt.Sprintf("run: invalid run id %q: use %s", *runID, toolbus.IDShape)}
	}
	// The run names a model only when asked to: a planner serves the others with its own
	// (TOOLBUS_MODEL of the planner, not of this client).
	rs := toolbus.RunStarted{
		RunID: *runID, Model: *model, Principal: toolbus.Principal{ID: *principal}, Approvers: slices.DeleteFunc(splitList(*approvers), func(s string) bool { return s == "" }),
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: question}},
		Limits:   toolbus.Limits{MaxSteps: *maxSteps, Deadline: time.Now().Add(*timeout).UTC(), TokenBudget: *budget},
	}
	if strings.TrimSpace(*system) != "" {
		// Only when asked for: a run gets no persona it did not choose.
		rs.Messages = append([]toolbus.Message{{Role: toolbus.RoleSystem, Content: *system}}, rs.Messages...)
	}
	if *tools != "" {
		for _, t := range strings.Split(*tools, ",") {
			rs.AllowedTools = append(rs.AllowedTools, strings.TrimSpace(t))
		}
	}
	return rs, nil
}

// runFollower prints a run's events as they come until it ends, and says what the run
// waits for when nothing comes.
type runFollower struct {
	c   *node.Conn
	run string
	out io.Writer
	// workersDone reports the end of the in-process workers (nil: none, or already
	// received).
	workersDone chan error
}

// follow prints the run's events from watch until its outcome; the exit code says
// which (0 completed, 3 waiting for approval, 1 otherwise; 130 interrupted).
func (f *runFollower) follow(ctx context.Context, watch *runlog.Watcher) error {
	p := timeline.NewPrinter(f.out)
	idleSince, lastHint := time.Now(), ""
	for {
		ev, ok, err := watch.Next(ctx, time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return &exitError{code: 130, msg: "interrupted; the run goes on: toolbus cancel " + f.run}
			}
			return fmt.Errorf("run: %w", err)
		}
		if !ok {
			if time.Since(idleSince) >= waitHint {
				// Said once per silence, and again when what it finds changes (a worker
				// that starts failing on the run's message).
				if h := timeline.WaitingHint(ctx, f.c.Bus, p); h != lastHint {
					lastHint = h
					fmt.Fprintln(f.out, h)
				}
			}
			if err := f.workersStopped(); err != nil {
				return err
			}
			continue
		}
		idleSince, lastHint = time.Now(), ""
		status, done := p.Print(ev)
		if ev.Meta.Type == events.TypeToolQuestion && !done {
			// A call asks its caller: say now how to answer, not after a silence.
			lastHint = timeline.WaitingHint(ctx, f.c.Bus, p)
			fmt.Fprintln(f.out, lastHint)
		}
		if done {
			switch status {
			case toolbus.RunCompleted:
				return nil
			case toolbus.RunWaitingForApproval:
				var re toolbus.RunEnded
				if ev.Decode(&re) == nil {
					for _, c := range re.Pending { // what moves the run on
						fmt.Fprintf(f.out, "decide %s: %s\n", c.CallID, decide.ApproveCommand(f.run, c.CallID))
					}
				}
				return &exitError{code: 3}
			default:
				return &exitError{code: 1}
			}
		}
	}
}

// workersStopped returns an error once the in-process workers stopped: nothing will
// answer the run.
func (f *runFollower) workersStopped() error {
	select {
	case werr := <-f.workersDone: // never ready when nil
		f.workersDone = nil
		if werr == nil {
			werr = errors.New("the workers stopped")
		}
		return fmt.Errorf("run: %w; the run goes on when workers serve it: toolbus tail %s", werr, f.run)
	default:
		return nil
	}
}

// waitHint is how long a run may be silent before `toolbus run` says what it waits for.
var waitHint = 5 * time.Second
