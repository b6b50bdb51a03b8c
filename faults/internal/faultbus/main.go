// Command faultbus is the worker binary of the fault suite (package faults). It runs the
// planner and executor roles of cmd/toolbus on the same libraries, with what the suite
// needs on top and nothing else changed:
//
//   - a scripted model that asks for random-latency calls and checks, at every step,
//     that the history holds each result in call order (TOOLBUS_MODEL=<tool>:<calls>x<steps>[:<min>-<max>]);
//   - an "append" tool with a side effect visible across processes: it waits {"ms"} (and,
//     with TOOLBUS_FAULT_APPEND_GATE, until that file exists) then appends the call's
//     idempotency key to the file TOOLBUS_FAULT_APPEND_FILE;
//   - TOOLBUS_FAULT_ASK_TOOL=<name>: a tool that asks its run's caller which account to
//     use (executor.Ask), then appends "<idempotency key> <instance> <attempt> <tool>
//     <account>" to TOOLBUS_FAULT_APPEND_FILE: one line per run of the tool that got its
//     answer (the side effect after the answer, as docs/writing-tools.md says);
//   - TOOLBUS_FAULT_KILL_AFTER=<fragment>: the process SIGKILLs itself on the first write to
//     the server after it published a message whose subject contains the fragment (and,
//     since publishing waits for the stream's acknowledgement, after the stream stored
//     it): e.g. ".tool.finished.append " kills an executor between storing a result and
//     acknowledging the call, ".model.requested " kills an injector between publishing
//     the next step and closing the joined step and acknowledging the result.
//
// The other workers of the suite are the real toolbus binary.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

type config struct {
	NatsURL string `envconfig:"NATS_URL" required:"true"`
	// Creds is the role's or team's credentials file (TOOLBUS_NATS_CREDS), as the
	// toolbus binary reads it.
	Creds string `envconfig:"NATS_CREDS"`
	// Team owns the tools of an executor (TOOLBUS_TEAM), as with the toolbus binary.
	Team string `envconfig:"TEAM"`
	events.Config
	Instance string `envconfig:"INSTANCE" default:"faultbus"`
	// Concurrency, AckWait and MaxDeliver unset take the workers' defaults.
	Concurrency int           `envconfig:"CONCURRENCY"`
	AckWait     time.Duration `envconfig:"ACK_WAIT"`
	MaxDeliver  int           `envconfig:"MAX_DELIVER"`
	Grace       time.Duration `envconfig:"GRACE" default:"5s"`
	Model       string        `envconfig:"MODEL" default:"sleep:4x3:1-100"`
	// ModelTimeout of the planner; its consumer's ack wait is this plus 30s, which is how
	// long a model request lost with a dead server waits for redelivery. The script
	// answers at once, so the suite does not wait the default 2m30s.
	ModelTimeout time.Duration `envconfig:"MODEL_TIMEOUT" default:"10s"`
	LogLevel     string        `envconfig:"LOG_LEVEL" default:"info"`
	AppendFile   string        `envconfig:"FAULT_APPEND_FILE"`
	// AppendGate, when set, holds every append call after its wait until this file
	// exists: a test keeps runs in flight for as long as it needs.
	AppendGate string `envconfig:"FAULT_APPEND_GATE"`
	// AppendTools names the append tools to register (each writes "<key> <instance>
	// <attempt> <tool>" lines), e.g. append_a,append_b for deployments that serve
	// different subsets.
	AppendTools []string `envconfig:"FAULT_APPEND_TOOLS" default:"append"`
	// AskTool names the asking tool to register (none when empty).
	AskTool string `envconfig:"FAULT_ASK_TOOL"`
	// AppendHeartbeat, when set, makes the append tools long-running with this
	// HeartbeatTimeout: while they wait they report progress four times per period.
	AppendHeartbeat time.Duration `envconfig:"FAULT_APPEND_HEARTBEAT"`
	// ExecutorTools is the deployment subset of this executor (empty: every tool).
	ExecutorTools []string `envconfig:"EXECUTOR_TOOLS"`
	// ParkAfter unset takes the worker's default (worker.Config.ParkAfter).
	ParkAfter time.Duration `envconfig:"EXECUTOR_PARK_AFTER"`
	KillAfter string        `envconfig:"FAULT_KILL_AFTER"`
	// KillSkip: a write that also contains this fragment does not arm the kill (for
	// example "/0/model.requested": the injector publishes step 0 when a run starts,
	// and the suite wants the kill after a joined step).
	KillSkip string `envconfig:"FAULT_KILL_SKIP"`
}

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "planner" && os.Args[1] != "executor" && os.Args[1] != "injector") {
		fmt.Fprintln(os.Stderr, "usage: faultbus planner|executor|injector (configured by TOOLBUS_* variables)")
		os.Exit(2)
	}
	var cfg config
	if err := envconfig.Process("TOOLBUS", &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "faultbus:", err)
		os.Exit(2)
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Args[1], log); err != nil {
		log.Error("faultbus failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, role string, log *slog.Logger) error {
	// The roles' own connection: reconnecting forever, its events logged (package connect).
	opts, err := connect.Options{Creds: cfg.Creds}.NATSOptions("faultbus "+cfg.Instance, log)
	if err != nil {
		return err
	}
	if cfg.KillAfter != "" {
		opts = append(opts, nats.SetCustomDialer(&killDialer{log: log, after: []byte(cfg.KillAfter), skip: []byte(cfg.KillSkip)}))
	}
	nc, err := nats.Connect(cfg.NatsURL, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	bus, err := events.Open(ctx, nc, cfg.Config)
	if err != nil {
		return err
	}
	switch role {
	case "injector":
		return serve(injector.New(bus, injector.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: cfg.Instance, Concurrency: cfg.Concurrency, Grace: cfg.Grace, Logger: log}}))(ctx)
	case "planner":
		model, err := parseModel(cfg.Model)
		if err != nil {
			return err
		}
		cat, err := bus.Store().WatchCatalog(ctx, log)
		if err != nil {
			return err
		}
		return serve(planner.New(bus, model, cat, planner.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: cfg.Instance, Concurrency: cfg.Concurrency, Grace: cfg.Grace, Logger: log},
			ModelTimeout: cfg.ModelTimeout,
		}))(ctx)
	default:
		reg := executor.NewRegistry()
		if err := packs.Register(reg, "demo", "diag"); err != nil {
			return err
		}
		for _, name := range cfg.AppendTools {
			if err := reg.Register(appendTool(cfg, name)); err != nil {
				return err
			}
		}
		if cfg.AskTool != "" {
			if err := reg.Register(askTool(cfg, cfg.AskTool)); err != nil {
				return err
			}
		}
		exec, err := executor.New(reg, executor.WithLogger(log), executor.WithInstance(cfg.Instance))
		if err != nil {
			return err
		}
		return serve(worker.New(bus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: cfg.Instance, Concurrency: cfg.Concurrency, AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver, Grace: cfg.Grace, Logger: log},
			Tools: cfg.ExecutorTools, ParkAfter: cfg.ParkAfter, Team: cfg.Team,
		}))(ctx)
	}
}

// serve is the Run of a worker built by its constructor, or a func returning the
// constructor's error.
func serve(w interface{ Run(context.Context) error }, err error) func(context.Context) error {
	if err != nil {
		return func(context.Context) error { return err }
	}
	return w.Run
}

// appendMu serializes the append tools of a process on the shared file.
var appendMu sync.Mutex

// appendTool is a side effect the test can count across processes: one line per run of
// the tool, "<idempotency key> <instance> <attempt> <tool>".
func appendTool(cfg config, name string) executor.Tool {
	mu := &appendMu
	timeout := time.Duration(0)
	switch {
	case cfg.AppendGate != "":
		// A closed gate holds the calls as long as the test needs (day two's commands on
		// a loaded machine take more than the executor's default timeout).
		timeout = 5 * time.Minute
	case cfg.AppendHeartbeat > 0:
		timeout = 2 * time.Minute
	}
	return executor.Tool{
		Name: name, Timeout: timeout, HeartbeatTimeout: cfg.AppendHeartbeat,
		Description: "Fault suite: wait ms milliseconds, then append the call's idempotency key to a file (a side effect).",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"ms":{"type":"integer","minimum":0,"maximum":60000}}}`),
		ReadOnly:    false,
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			if cfg.AppendFile == "" {
				return nil, errors.New("TOOLBUS_FAULT_APPEND_FILE is not set")
			}
			var in struct{ MS int }
			_ = json.Unmarshal(args, &in)
			if err := waitReporting(ctx, time.Duration(in.MS)*time.Millisecond, cfg.AppendHeartbeat/4); err != nil {
				return nil, err
			}
			if err := waitGate(ctx, cfg.AppendGate); err != nil {
				return nil, err
			}
			// A cooperative tool: the side effect only while the executor holds the
			// call (after a pause, or cut off, another executor may own it).
			if !ci.LeaseValid() {
				return nil, errors.New("lease lost before the side effect: not done")
			}
			mu.Lock()
			defer mu.Unlock()
			f, err := os.OpenFile(cfg.AppendFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			if _, err := fmt.Fprintf(f, "%s %s %d %s\n", ci.IdempotencyKey, cfg.Instance, ci.Attempt, name); err != nil {
				return nil, err
			}
			if err := f.Sync(); err != nil {
				return nil, err
			}
			return map[string]string{"key": ci.IdempotencyKey}, nil
		},
	}
}

// waitGate waits until the file gate exists ("" waits for nothing) or ctx ends.
func waitGate(ctx context.Context, gate string) error {
	for gate != "" {
		if _, err := os.Stat(gate); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// askTool asks the run's caller which account to use, then appends "<idempotency key>
// <instance> <attempt> <tool> <account>" to the append file: the side effect comes after
// the answer, so a run of the tool that dies while it waits does nothing, and the run
// that gets the answer (the same question asked again) does it once.
func askTool(cfg config, name string) executor.Tool {
	schema := json.RawMessage(`{"type":"object","properties":{"account":{"type":"string","enum":["checking","savings"]}},"required":["account"]}`)
	return executor.Tool{
		Name: name, Timeout: 3 * time.Minute,
		Description: "Fault suite: ask the caller which account to use, then append the call's idempotency key and the account to a file.",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			if cfg.AppendFile == "" {
				return nil, errors.New("TOOLBUS_FAULT_APPEND_FILE is not set")
			}
			a, err := executor.Ask(ctx, "Which account?", schema)
			if err != nil {
				return nil, err
			}
			var ans struct{ Account string }
			if a.Action != "accept" || json.Unmarshal(a.Content, &ans) != nil {
				return nil, fmt.Errorf("no account: the caller answered %s", a.Action)
			}
			appendMu.Lock()
			defer appendMu.Unlock()
			f, err := os.OpenFile(cfg.AppendFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			if _, err := fmt.Fprintf(f, "%s %s %d %s %s\n", ci.IdempotencyKey, cfg.Instance, ci.Attempt, name, ans.Account); err != nil {
				return nil, err
			}
			if err := f.Sync(); err != nil {
				return nil, err
			}
			return map[string]string{"key": ci.IdempotencyKey, "account": ans.Account, "by": a.Who}, nil
		},
	}
}

// waitReporting waits d, or until ctx ends, reporting progress every period (none when
// period is 0).
func waitReporting(ctx context.Context, d, period time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var tick <-chan time.Time
	if period > 0 {
		tk := time.NewTicker(period)
		defer tk.Stop()
		tick = tk.C
	}
	start := time.Now()
	for {
		select {
		case <-t.C:
			return nil
		case <-tick:
			_ = executor.Progress(ctx, float64(time.Since(start).Milliseconds()), float64(d.Milliseconds()), "waiting")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// killDialer wraps the connection to the server: once the process has written a
// message whose subject contains after, its next write kills the process instead.
type killDialer struct {
	log   *slog.Logger
	after []byte
	skip  []byte
	armed atomic.Value // the line that armed it
}

func (d *killDialer) Dial(network, address string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 2 * time.Second}).Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &killConn{Conn: c, d: d}, nil
}

type killConn struct {
	net.Conn
	d *killDialer
}

func (c *killConn) Write(p []byte) (int, error) {
	if armed, _ := c.d.armed.Load().(string); armed != "" {
		c.d.log.Warn("fault injected: SIGKILL before the write that follows a publication", "after", armed)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal ends the process; the write never happens
	}
	n, err := c.Conn.Write(p)
	if i := bytes.Index(p, c.d.after); i >= 0 && (len(c.d.skip) == 0 || !bytes.Contains(p, c.d.skip)) {
		start, end := bytes.LastIndexByte(p[:i], '\n')+1, len(p)
		if sp := bytes.IndexByte(p[i+1:], ' '); sp >= 0 {
			end = i + 1 + sp
		}
		c.d.armed.Store(string(p[start:end]))
	}
	return n, err
}

// scriptModel asks for calls of one tool at each of the first steps steps, then answers.
// sleep and append calls get a latency drawn (deterministically per run, step and call)
// from [min, max] ms. Before planning step s it checks that the history holds, after each
// assistant message, one tool message per call in call order, with the right output; a
// wrong history fails the run (permanent model error), which the suite detects.
type scriptModel struct {
	tool         string   // the tool of every call, or the first of tools
	tools        []string // call i uses tools[i%len(tools)] (spec a+b+c)
	calls, steps int
	minMS, maxMS int
}

// parseModel reads <tool>:<calls>x<steps>[:<min>-<max>], e.g. sleep:4x3:1-100.
func parseModel(spec string) (*scriptModel, error) {
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, fmt.Errorf("model %q: want <tool>:<calls>x<steps>[:<min>-<max>]", spec)
	}
	m := &scriptModel{tools: strings.Split(parts[0], "+")}
	m.tool = m.tools[0]
	c, s, ok := strings.Cut(parts[1], "x")
	var err1, err2 error
	m.calls, err1 = strconv.Atoi(c)
	m.steps, err2 = strconv.Atoi(s)
	if !ok || err1 != nil || err2 != nil || m.calls < 1 || m.steps < 0 {
		return nil, fmt.Errorf("model %q: bad <calls>x<steps>", spec)
	}
	if len(parts) == 3 {
		lo, hi, ok := strings.Cut(parts[2], "-")
		m.minMS, err1 = strconv.Atoi(lo)
		m.maxMS, err2 = strconv.Atoi(hi)
		if !ok || err1 != nil || err2 != nil || m.minMS < 0 || m.maxMS < m.minMS {
			return nil, fmt.Errorf("model %q: bad <min>-<max>", spec)
		}
	}
	return m, nil
}

func (m *scriptModel) latency(run string, step, i int) int {
	if m.maxMS == m.minMS {
		return m.minMS
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d/%d", run, step, i)
	return m.minMS + int(h.Sum32()%uint32(m.maxMS-m.minMS+1))
}

// toolOf is the tool of call i.
func (m *scriptModel) toolOf(i int) string { return m.tools[i%len(m.tools)] }

// kind is what the checks know a tool as: sleep, append (any append_* tool) or other.
func kind(tool string) string {
	if strings.HasPrefix(tool, "append") {
		return "append"
	}
	return tool
}

func (m *scriptModel) args(run string, step, i int) string {
	if k := kind(m.toolOf(i)); k == "sleep" || k == "append" {
		return `{"ms":` + strconv.Itoa(m.latency(run, step, i)) + `}`
	}
	return `{}`
}

func (m *scriptModel) Complete(_ context.Context, req planner.Request) (planner.Response, error) {
	if err := m.check(req); err != nil {
		return planner.Response{}, planner.Permanent(err)
	}
	if req.Step >= m.steps {
		return planner.Response{Message: toolbus.Message{Role: toolbus.RoleAssistant,
			Content: fmt.Sprintf("done after %d steps", req.Step)}, Model: "faultbus"}, nil
	}
	calls := make([]toolbus.ToolCall, m.calls)
	for i := range calls {
		calls[i] = toolbus.ToolCall{CallID: "c" + strconv.Itoa(i), Tool: m.toolOf(i), Arguments: m.args(req.RunID, req.Step, i)}
	}
	return planner.Response{Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: calls}, Model: "faultbus"}, nil
}

// check verifies the history of req: input messages, then per earlier step the
// assistant message and its tool messages in call order.
func (m *scriptModel) check(req planner.Request) error {
	msgs := req.Messages
	i := 0
	for i < len(msgs) && msgs[i].Role != toolbus.RoleAssistant {
		i++
	}
	for step := 0; step < req.Step; step++ {
		if i >= len(msgs) || msgs[i].Role != toolbus.RoleAssistant {
			return fmt.Errorf("history of %s step %d: no assistant message for step %d", req.RunID, req.Step, step)
		}
		calls := msgs[i].ToolCalls
		i++
		for k, c := range calls {
			if i >= len(msgs) {
				return fmt.Errorf("history of %s step %d: step %d has %d of %d tool messages", req.RunID, req.Step, step, k, len(calls))
			}
			tm := msgs[i]
			if tm.Role != toolbus.RoleTool || tm.ToolCallID != c.CallID {
				return fmt.Errorf("history of %s step %d: step %d message %d answers %q, want %q (call order)", req.RunID, req.Step, step, k, tm.ToolCallID, c.CallID)
			}
			switch kind(m.toolOf(k)) {
			case "sleep":
				var out struct {
					SleptMS *int `json:"slept_ms"`
				}
				want := m.latency(req.RunID, step, k)
				if err := json.Unmarshal([]byte(tm.Content), &out); err != nil || out.SleptMS == nil || *out.SleptMS != want {
					return fmt.Errorf("history of %s step %d: step %d result %d is %q, want slept_ms %d", req.RunID, req.Step, step, k, tm.Content, want)
				}
			case "append":
				var out struct{ Key string }
				want := req.RunID + "/" + strconv.Itoa(step) + "/" + c.CallID
				if err := json.Unmarshal([]byte(tm.Content), &out); err != nil || out.Key != want {
					return fmt.Errorf("history of %s step %d: step %d result %d is %q, want key %s", req.RunID, req.Step, step, k, tm.Content, want)
				}
			}
			i++
		}
	}
	if i != len(msgs) {
		return fmt.Errorf("history of %s step %d: %d unexpected trailing messages", req.RunID, req.Step, len(msgs)-i)
	}
	return nil
}
