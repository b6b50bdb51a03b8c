// Command toolbus runs the toolbus pipeline: planner, executor and injector workers over
// NATS JetStream, and the client commands that submit and follow runs.
//
//	toolbus up                      embedded JetStream (or TOOLBUS_NATS_URL) + all workers
//	toolbus init [--tools a,b]      (admin) create the stream, buckets and consumers
//	toolbus planner|executor|injector  one role against TOOLBUS_NATS_URL
//	toolbus run "question"          submit a run and stream its events until it ends
//	toolbus call <tool> '<json>'    call one tool through the fleet (a pre-planned run)
//	toolbus approve|deny|respond|cancel  decide a call waiting for approval, cancel a run
//	toolbus runs|tail|replay        list runs, follow events live, audit a run
//	toolbus tools                   list the tool catalog and who serves each tool
//	toolbus console                 web console at TOOLBUS_CONSOLE_ADDR
//	toolbus server -c FILE          a NATS server from a configuration file (deploy/nats/)
//	toolbus admin <subcommand>      a deployment's credentials: teams, tools, clients (internal/admin)
//	toolbus env                     print the configuration variables
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"

	"github.com/toolbus/toolbus/audit/trail"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/admin"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor/mcptools"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// commandHelp is the help of the commands that take no flags nor arguments.
var commandHelp = map[string]string{
	"up": `usage: toolbus up
  run an embedded JetStream server (or use TOOLBUS_NATS_URL) and the planner, executor and
  injector in this process; with TOOLBUS_CONSOLE_ADDR set it serves the web console too.
  Settings come from TOOLBUS_* variables: toolbus env lists them.
`,
	"planner":  roleHelp("planner", "consumes model.requested, calls the model (TOOLBUS_MODEL), publishes model.responded and the tool calls"),
	"executor": roleHelp("executor", "runs the tool calls of its tools (TOOLBUS_TOOLS, TOOLBUS_EXECUTOR_TOOLS) and publishes their results"),
	"injector": roleHelp("injector", "joins each step's results in call order and publishes the next model request or the run's outcome"),
	"console": `usage: toolbus console
  serve the web console at TOOLBUS_CONSOLE_ADDR (host:port): runs, their timelines, calls and
  transcripts, live. Users sign in with a token of TOOLBUS_CONSOLE_USERS_FILE (toolbus token NAME
  makes one) to read, approve, deny and cancel; TOOLBUS_CONSOLE_PUBLIC_READ=true lets anyone read.
  Reads TOOLBUS_NATS_URL, else the local store of the embedded server (TOOLBUS_DATA_DIR).
`,
	"env": `usage: toolbus env
  list every TOOLBUS_* configuration variable with its default and what it does.
`,
}

func roleHelp(role, what string) string {
	return fmt.Sprintf(`usage: toolbus %s
  run the %s role against TOOLBUS_NATS_URL (set up by toolbus init): it %s.
  Settings come from TOOLBUS_* variables: toolbus env lists them.
`, role, role, what)
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// wantsHelp reports whether a command's arguments ask for help (before any "--").
func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if isHelp(a) {
			return true
		}
	}
	return false
}

// version is the module version of the binary and its VCS revision, when known.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			v += "+dirty"
		}
	}
	return v + " " + bi.GoVersion
}

// clientCommands are the commands a person runs against a pipeline: their output is
// the answer, so they log only warnings and errors (not "connected to NATS", nor the
// in-process workers of an embedded run) unless -v or TOOLBUS_LOG_LEVEL asks for more.
var clientCommands = map[string]bool{
	"init": true, "run": true, "call": true, "approve": true, "deny": true, "respond": true, "cancel": true, "answer": true,
	"runs": true, "tools": true, "tail": true, "replay": true,
}

// clientCommand are the client commands that take the arguments and both outputs.
var clientCommand = map[string]func(context.Context, Config, *slog.Logger, []string, io.Writer, io.Writer) error{
	"run": cmdRun, "cancel": cmdCancel, "answer": cmdAnswer, "runs": cmdRuns, "tools": cmdTools, "tail": cmdTail,
	"replay": cmdReplay, "init": cmdInit,
}

// verbose reports whether a command's arguments (before any "--") ask for -v.
func verbose(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-v", "--v", "-v=true", "--v=true":
			return true
		}
	}
	return false
}

// clientLogLevel is the log level of a client command: info with -v (debug stays
// debug), the level TOOLBUS_LOG_LEVEL sets when set, else warn.
func clientLogLevel(level string, set, verbose bool) string {
	switch {
	case verbose && (level == "warn" || level == "error" || !set):
		return "info"
	case verbose, set:
		return level
	}
	return "warn"
}

// exitError carries a specific exit code.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

const usage = `usage: toolbus <command> [args]

commands:
  up                       run an embedded JetStream server (or use TOOLBUS_NATS_URL) and all workers
  init [--tools a,b] [--read-mirror=false]
                           (admin credentials) create or update on TOOLBUS_NATS_URL the stream,
                           the buckets, the read mirror and every role's consumers; idempotent.
                           Workers with role credentials then only bind to them
  planner | executor | injector
                           run one role against TOOLBUS_NATS_URL (set up by toolbus init)
  run [flags] "question"   submit a run and stream its events until it ends
                           (with no TOOLBUS_NATS_URL it runs the whole pipeline in-process)
  call <tool> ['<json>'] [--json]
                           call one tool through the fleet as a pre-planned run (audited; no
                           model); prints its output; exit 0 succeeded, 1 failed, 3 waits for
                           approval, 4 rejected, 5 timed out, 6 cancelled
  approve <run> <call_id> [--args '{...}'] [--reason text] [--step n] [--who name]
                           grant a call that waits for approval; the call runs (with --args: with
                           your arguments, checked against the tool's schema) and the run goes on
  deny <run> <call_id> --message text [--step n] [--who name]
                           deny it; the model reads rejected/approval_denied with the message
  respond <run> <call_id> --answer text [--step n] [--who name]
                           answer in the tool's place: the tool does not run, the model reads the
                           answer as the call's result
  answer <run> <call_id> '{...}' | --decline [--who name]
                           answer the question a running call asks (its schema checks the answer)
  cancel <run> [--reason text]
                           cancel a run: calls in flight are cancelled, the run ends cancelled
  runs [--json] [--status s]
                           list runs with their status, age and calls' results
                           (a completed run's failed or rejected calls show)
  tools [--json]           list the tool catalog: instances serving each tool, pending calls
  tail [run] [--all] [--color auto|always|never]
                           follow events live (new ones; --all from the start); with no
                           TOOLBUS_NATS_URL, the stored events of the local store
  replay <run> [--json] [--verify]  audit a run from the stream: timeline, transcript,
                           invariants (exit 1 when one is broken); --verify: its signed trail
  audit export RUN -o FILE | audit verify FILE   a run's audit bundle, out or verified offline
  console                  serve the web console at TOOLBUS_CONSOLE_ADDR (users sign in with
                           a token of TOOLBUS_CONSOLE_USERS_FILE)
  mcp [--http ADDR]        serve the tool catalog to MCP hosts over stdio (or streamable HTTP,
                           for the bearer tokens of TOOLBUS_MCP_TOKENS_FILE);
                           each tools/call is a run on the bus (audit, allowlist, timeouts)
  token NAME [--teams a,b] a new token for mcp --http or the console, and its access-list line
  mcp-login SERVER         log in once to an MCP server of TOOLBUS_MCP_CONFIG (authorization_code)
  server -c FILE [-sd DIR] run a NATS server from a configuration file (deploy/nats/, or what
                           go run ./deploy/nats/gen writes): -sd, -a, -p override the file;
                           SIGHUP reloads it; exit 1 when it is invalid
  admin <subcommand>       administer a deployment's credentials in one directory: init once, then
                           add-team, grant, revoke, remove-team, add-client, remove-client, rotate
                           (only that tenant changes; -push applies accounts with no reload)
  ready [URL]              exit 0 when this process's /readyz answers 200 (container health checks)
  bench [flags]            measure toolbus beside raw JetStream and an in-process loop
  env                      list the TOOLBUS_* configuration variables
  version                  print the version (also --version)

Every command takes -h or --help; client commands (init, run, call, approve, deny, respond, cancel,
runs, tools, tail, replay) log only warnings unless -v (or TOOLBUS_LOG_LEVEL) asks for more.
`

// run is main without the process: tests call it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if isHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, usage) // asked for: the answer goes to stdout, exit 0
		return 0
	}
	if args[0] == "version" || args[0] == "--version" || args[0] == "-version" {
		fmt.Fprintln(stdout, "toolbus", version())
		return 0
	}
	// Commands without flags take no arguments: --help prints what they do (and never
	// starts a server or connects), anything else is refused.
	if help, ok := commandHelp[args[0]]; ok && len(args) > 1 {
		if len(args) == 2 && isHelp(args[1]) {
			fmt.Fprint(stdout, help)
			return 0
		}
		fmt.Fprintf(stderr, "toolbus %s: unexpected argument %q\n%s", args[0], args[1], help)
		return 2
	}
	if wantsHelp(args[1:]) {
		// The flag package prints a command's usage to its output: asked for, that is
		// stdout (flagError makes -h exit 0).
		stderr = stdout
	}
	cfg, err := node.Load()
	if err != nil {
		fmt.Fprintln(stderr, "toolbus:", err)
		return 2
	}
	cfg.LogOut = stderr
	cmd, rest := args[0], args[1:]
	if clientCommands[cmd] {
		cfg.LogLevel = clientLogLevel(cfg.LogLevel, os.Getenv("TOOLBUS_LOG_LEVEL") != "", verbose(rest))
	}
	log := cfg.Logger()
	if msg := cfg.TeamRefusal(cmd); msg != "" && (clientCommands[cmd] || cmd == "console" || cmd == "mcp") {
		fmt.Fprintln(stderr, "toolbus:", msg)
		return 1
	}
	switch cmd {
	case "up":
		err = cmdUp(ctx, cfg, log)
	case "planner", "executor", "injector":
		err = cmdRole(ctx, cfg, log, cmd)
	case "run", "cancel", "answer", "runs", "tools", "tail", "replay", "init":
		err = clientCommand[cmd](ctx, cfg, log, rest, stdout, stderr)
	case "call":
		err = cmdCall(ctx, cfg, log, rest, stdinOf, stdout, stderr)
	case "approve", "deny", "respond":
		err = cmdDecide(ctx, cfg, log, rest, stdout, stderr, cmd)
	case "console":
		err = cmdConsole(ctx, cfg, log)
	case "mcp":
		err = cmdMCP(ctx, cfg, log, rest, stdout, stderr)
	case "bench":
		err = cmdBench(ctx, rest, stdout)
	case "server":
		err = cmdServer(ctx, rest, stdout, stderr)
	case "token":
		err = cmdToken(rest, stdout, stderr)
	case "ready":
		err = cmdReady(ctx, cfg, rest, stdout, stderr)
	case "env":
		err = cmdEnv(cfg, stdout)
	case "admin":
		return admin.Main(ctx, rest, cfg.URL, stdout, stderr)
	case "audit":
		return trail.Main(ctx, rest, openAudit(cfg, log), stdout, stderr)
	case "mcp-login":
		err = mcptools.LoginCommand(ctx, cfg.MCPConfig, rest, stdout)
	default:
		fmt.Fprintf(stderr, "toolbus: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(stderr, "toolbus:", ee.msg)
			}
			return ee.code
		}
		var tr *events.TenantRefusal
		if errors.As(err, &tr) {
			fmt.Fprintf(stderr, "toolbus %s: %s\n", cmd, tr.Msg) // the one sentence, not the server's words
			return 1
		}
		if errors.Is(err, node.ErrNoURL) {
			fmt.Fprintf(stderr, "toolbus %s: %v\n", cmd, err) // which command needs a server
			return 1
		}
		fmt.Fprintln(stderr, "toolbus:", err)
		return 1
	}
	return 0
}

// Config is the configuration of the process (package node).
type Config = node.Config

// errNoStore: a read-only command found neither TOOLBUS_NATS_URL nor a local store.
var errNoStore = errors.New("nothing to read")

// openAudit opens the bus of toolbus audit export.
func openAudit(cfg Config, log *slog.Logger) func(context.Context) (*events.Bus, func(), error) {
	return func(ctx context.Context) (*events.Bus, func(), error) { return node.BusOf(openReader(ctx, cfg, log)) }
}

// openReader opens the bus for a command that only reads (runs, tools, replay, console):
// TOOLBUS_NATS_URL, else the local store of the embedded server, which must exist: a
// read-only command never creates ./data.
func openReader(ctx context.Context, cfg Config, log *slog.Logger) (*node.Conn, error) {
	if cfg.URL == "" {
		store := filepath.Join(cfg.DataDir, "jetstream")
		if _, err := os.Stat(store); err != nil {
			return nil, &exitError{code: 1, msg: fmt.Sprintf("%v: TOOLBUS_NATS_URL is not set and there is no local store in %s (start toolbus up, or set TOOLBUS_NATS_URL)",
				errNoStore, store)}
		}
		// A store another process's server holds (toolbus up) is read through that
		// server: a second server on the same files would lose writes.
		if h, held := embedded.ReadHolder(store); held && h.URL != "" {
			log.Info("the local store is held by another process: reading through its server", "pid", h.PID, "url", h.URL)
			cfg.URL = h.URL
			return node.Open(ctx, cfg, log, false)
		}
	}
	return node.Open(ctx, cfg, log, true)
}
