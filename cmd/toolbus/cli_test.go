package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// cli runs the command line in this process with a fresh data dir and no server.
func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code = run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// noServerEnv points toolbus at a data dir that does not exist, with no NATS URL.
func noServerEnv(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	t.Setenv("TOOLBUS_DATA_DIR", dir)
	t.Setenv("TOOLBUS_NATS_URL", "")
	t.Setenv("TOOLBUS_LOG_LEVEL", "")
	t.Setenv("TOOLBUS_LOG_FORMAT", "")
	return dir
}

func wantNoDir(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s was created (stat: %v)", dir, err)
	}
}

// TestCLIHelpAndVersion: --help of every command answers on stdout with exit 0 and
// never starts a server or connects; commands without arguments refuse extra ones.
func TestCLIHelpAndVersion(t *testing.T) {
	dir := noServerEnv(t)
	cases := []struct {
		args       []string
		code       int
		stdout     string // contained in stdout
		stderr     string // contained in stderr
		emptyErr   bool
		emptyStdio bool
	}{
		{args: []string{"--help"}, stdout: "usage: toolbus <command>", emptyErr: true},
		{args: []string{"help"}, stdout: "usage: toolbus <command>", emptyErr: true},
		{args: nil, code: 2, stderr: "usage: toolbus <command>"},
		{args: []string{"--version"}, stdout: "toolbus ", emptyErr: true},
		{args: []string{"version"}, stdout: "toolbus ", emptyErr: true},
		{args: []string{"up", "--help"}, stdout: "usage: toolbus up", emptyErr: true},
		{args: []string{"up", "-h"}, stdout: "usage: toolbus up", emptyErr: true},
		{args: []string{"planner", "--help"}, stdout: "usage: toolbus planner", emptyErr: true},
		{args: []string{"executor", "--help"}, stdout: "usage: toolbus executor", emptyErr: true},
		{args: []string{"injector", "--help"}, stdout: "usage: toolbus injector", emptyErr: true},
		{args: []string{"console", "--help"}, stdout: "TOOLBUS_CONSOLE_USERS_FILE", emptyErr: true},
		{args: []string{"env", "--help"}, stdout: "usage: toolbus env", emptyErr: true},
		{args: []string{"run", "--help"}, stdout: "usage: toolbus run", emptyErr: true},
		{args: []string{"approve", "--help"}, stdout: "usage: toolbus approve", emptyErr: true},
		{args: []string{"runs", "-h"}, stdout: "usage: toolbus runs", emptyErr: true},
		{args: []string{"replay", "x", "--help"}, stdout: "usage: toolbus replay", emptyErr: true},
		{args: []string{"up", "now"}, code: 2, stderr: `toolbus up: unexpected argument "now"`},
		{args: []string{"planner", "--verbose"}, code: 2, stderr: `toolbus planner: unexpected argument "--verbose"`},
		{args: []string{"run", "--bogus", "q"}, code: 2, stderr: "flag provided but not defined: -bogus"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := cli(t, tc.args...)
			wantCode(t, strings.Join(tc.args, " "), code, tc.code, out, errOut)
			if tc.stdout != "" {
				wantContains(t, "stdout", out, tc.stdout)
			}
			if tc.stderr != "" {
				wantContains(t, "stderr", errOut, tc.stderr)
			}
			if tc.emptyErr && errOut != "" {
				t.Fatalf("help went to stderr:\n%s", errOut)
			}
			wantNoDir(t, dir)
		})
	}
}

// TestCLIRefusesBadValues: unknown log settings and statuses, and worker settings out
// of range, are refused with the variable and the valid values, before anything connects.
func TestCLIRefusesBadValues(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"log level", map[string]string{"TOOLBUS_LOG_LEVEL": "loud"}, []string{"runs"}, `TOOLBUS_LOG_LEVEL "loud": want debug, info, warn or error`},
		{"log format", map[string]string{"TOOLBUS_LOG_FORMAT": "xml"}, []string{"runs"}, `TOOLBUS_LOG_FORMAT "xml": want text or json`},
		{"negative concurrency", map[string]string{"TOOLBUS_CONCURRENCY": "-1"}, []string{"runs"}, `config: TOOLBUS_CONCURRENCY -1: want 1 or more (unset or 0: default 64)`},
		{"ack wait too short", map[string]string{"TOOLBUS_ACK_WAIT": "10ms"}, []string{"runs"}, `config: TOOLBUS_ACK_WAIT 10ms: want 1s or more (unset or 0: default 30s)`},
		{"negative max deliver", map[string]string{"TOOLBUS_MAX_DELIVER": "-3"}, []string{"runs"}, `config: TOOLBUS_MAX_DELIVER -3: want 1 or more`},
		{"negative grace", map[string]string{"TOOLBUS_GRACE": "-1s"}, []string{"runs"}, `config: TOOLBUS_GRACE -1s: want 0s or more`},
		{"negative max steps", map[string]string{"TOOLBUS_MAX_STEPS": "-2"}, []string{"runs"}, `config: TOOLBUS_MAX_STEPS -2: want 1 or more (unset: 10)`},
		{"negative max calls per step", map[string]string{"TOOLBUS_MAX_CALLS_PER_STEP": "-1"}, []string{"runs"}, `config: TOOLBUS_MAX_CALLS_PER_STEP -1: want 1 or more (unset or 0: default 128)`},
		{"negative token budget", map[string]string{"TOOLBUS_TOKEN_BUDGET": "-5"}, []string{"runs"}, `config: TOOLBUS_TOKEN_BUDGET -5: want 0 (none) or more`},
		{"negative runs in flight", map[string]string{"TOOLBUS_MAX_RUNS_IN_FLIGHT": "-1"}, []string{"runs"}, `config: TOOLBUS_MAX_RUNS_IN_FLIGHT -1: want 0 (no bound) or more`},
		{"negative starts per second", map[string]string{"TOOLBUS_STARTS_PER_SECOND": "-0.5"}, []string{"runs"}, `config: TOOLBUS_STARTS_PER_SECOND -0.5: want 0 (no bound) or more`},
		{"negative start bytes", map[string]string{"TOOLBUS_MAX_START_BYTES": "-1"}, []string{"runs"}, `config: TOOLBUS_MAX_START_BYTES -1: want 0 (no bound) or more`},
		{"negative call timeout", map[string]string{"TOOLBUS_CALL_TIMEOUT": "-1s"}, []string{"runs"}, `config: TOOLBUS_CALL_TIMEOUT -1s: want 0s (the tool's own) or more`},
		{"negative output bound", map[string]string{"TOOLBUS_MAX_OUTPUT_BYTES": "-1"}, []string{"runs"}, `config: TOOLBUS_MAX_OUTPUT_BYTES -1: want 1 or more`},
		{"runs status", nil, []string{"runs", "--status", "bogus"}, `unknown status "bogus": want one of running, waiting_for_approval, completed, failed, limit_reached, cancelled`},
		{"missing model key", map[string]string{"TOOLBUS_MODEL": "openai:gpt-4.1", "OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""},
			[]string{"run", "hi"}, "needs OPENAI_API_KEY"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := noServerEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, out, errOut := cli(t, tc.args...)
			wantCode(t, tc.name, code, 2, out, errOut)
			wantContains(t, tc.name, errOut, tc.want)
			wantNoDir(t, dir)
		})
	}
}

// TestCLIReadOnlyCommandsCreateNothing: with no server and no local store, read-only
// commands say so and leave no ./data behind.
func TestCLIReadOnlyCommandsCreateNothing(t *testing.T) {
	for _, args := range [][]string{{"runs"}, {"tools"}, {"replay", "run-1"}, {"console"}, {"tail"}, {"tail", "run-1"}} {
		t.Run(strings.Join(args, "_"), func(t *testing.T) {
			dir := noServerEnv(t)
			t.Setenv("TOOLBUS_CONSOLE_ADDR", "127.0.0.1:0")
			t.Setenv("TOOLBUS_CONSOLE_PUBLIC_READ", "true") // else it refuses to start, before it looks
			code, out, errOut := cli(t, args...)
			wantCode(t, args[0], code, 1, out, errOut)
			wantContains(t, args[0], errOut, "nothing to read", "no local store")
			wantNoDir(t, dir)
		})
	}
}

// TestCLIRunFlagsAfterQuestion: flags after the question are flags, not words of it;
// after "--" everything is the question.
func TestCLIRunFlagsAfterQuestion(t *testing.T) {
	noServerEnv(t)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	code, out, errOut := cli(t, "run", "What is going on with INC-404?", "--max-steps", "1", "--id", "flags-after")
	wantCode(t, "run", code, 1, out, errOut)
	wantContains(t, "run", out, `run flags-after started: "What is going on with INC-404?"`, "limit_reached after 1 step(s)", "[max_steps]")

	code, out, errOut = cli(t, "run", "--id", "dashes", "--max-steps", "1", "--", "--max-steps", "is", "text")
	wantCode(t, "run --", code, 1, out, errOut)
	wantContains(t, "run --", out, `run dashes started: "--max-steps is text"`)
}

// TestCLIEnv: toolbus env lists every variable, TOOLBUS_RECORD included, each with what
// it means.
func TestCLIEnv(t *testing.T) {
	noServerEnv(t)
	code, out, errOut := cli(t, "env")
	wantCode(t, "env", code, 0, out, errOut)
	wantContains(t, "env", out, "VARIABLE", "MEANING", "TOOLBUS_RECORD", "TOOLBUS_CONSOLE_ADDR", "TOOLBUS_STREAM", "OPENAI_API_KEY")
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "TOOLBUS_") {
			continue
		}
		rows++
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Errorf("variable without a meaning: %q", line)
		}
	}
	if rows < 30 {
		t.Fatalf("%d variables listed:\n%s", rows, out)
	}
	// Every default is shown, those that live in the worker packages too (not "-").
	vars, err := node.EnvVars(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars {
		key, def := v.Name, v.Default
		if def == "-" {
			continue
		}
		if !strings.Contains(out, "\n"+key+" ") || !regexp.MustCompile(`\n`+key+` +`+regexp.QuoteMeta(def)+`  `).MatchString(out) {
			t.Errorf("%s is not listed with its default %q:\n%s", key, def, out)
		}
	}
}

// syncBuffer is a log sink safe for one writer and a polling reader.
type syncBuffer = testutil.Buffer

// TestCLIRunSaysWhatItWaitsFor: a run nobody serves does not wait silently: toolbus run
// says what the run waits for and warns that no worker consumes that queue.
func TestCLIRunSaysWhatItWaitsFor(t *testing.T) {
	old := waitHint
	waitHint = 200 * time.Millisecond
	t.Cleanup(func() { waitHint = old })
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{},
		provision.WithWorkers(provision.RolePlanner, provision.WorkerSettings{}), provision.WithWorkers(provision.RoleInjector, provision.WorkerSettings{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOOLBUS_NATS_URL", srv.URL)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")

	// follow runs toolbus run until its output has all of wants, then interrupts it.
	follow := func(id string, wants ...string) {
		t.Helper()
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var out, errOut syncBuffer
		done := make(chan int, 1)
		go func() { done <- run(rctx, []string{"run", "--id", id, "hello"}, &out, &errOut) }()
		eventstest.Eventually(t, 60*time.Second, func() error {
			for _, w := range wants {
				if !strings.Contains(out.String(), w) {
					return fmt.Errorf("output lacks %q:\n%s\n%s", w, out.String(), errOut.String())
				}
			}
			return nil
		})
		cancel()
		if code := <-done; code != 130 {
			t.Fatalf("toolbus run exited %d after the interrupt, want 130", code)
		}
	}

	// No worker at all: the run waits for the injector, whose queue nobody consumes.
	follow("wait-injector", "(waiting for the injector", "no worker consumes queue injector-started")

	// An injector but no planner: the run waits for the planner.
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ictx, stop := context.WithCancel(ctx)
	idone := make(chan struct{})
	go func() {
		defer close(idone)
		in, err := injector.New(bus, injector.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "inj", Logger: log, Grace: time.Second}})
		if err != nil {
			t.Error(err)
			return
		}
		_ = in.Run(ictx)
	}()
	t.Cleanup(func() { stop(); <-idone })
	follow("wait-planner", "(waiting for the planner", "no worker consumes queue planner")

	// A planner that fails on every message (as one whose credentials miss a
	// permission does): the run names the failing worker, not only the queue.
	cons, err := bus.EventStream().Consumer(ctx, events.ConsumerPlanner)
	if err != nil {
		t.Fatal(err)
	}
	fctx, fstop := context.WithCancel(ctx)
	fdone := make(chan struct{})
	go func() {
		defer close(fdone)
		for fctx.Err() == nil {
			batch, err := cons.Fetch(10, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				_ = m.NakWithDelay(100 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() { fstop(); <-fdone })
	follow("wait-failing", "(waiting for the planner", "the worker of queue planner keeps failing")
}

// TestCLIRunRefusesUnknownTools: --tools naming a tool no executor serves is refused
// with the tools of the catalog, and no run is started.
func TestCLIRunRefusesUnknownTools(t *testing.T) {
	noServerEnv(t)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	code, out, errOut := cli(t, "run", "--tools", "calculator,nosuch", "--id", "tools-1", "hi")
	wantCode(t, "run --tools nosuch", code, 2, out, errOut)
	wantContains(t, "run --tools nosuch", errOut, "no executor serves nosuch; the catalog has", "calculator")
	if strings.Contains(out, "started") {
		t.Fatalf("a run was started:\n%s", out)
	}
}

// TestCLIRunHeaderNamesThePlannersModel: the run's header names the model the planner
// answered with, not this client's TOOLBUS_MODEL.
func TestCLIRunHeaderNamesThePlannersModel(t *testing.T) {
	p := startOpsPipeline(t, map[string]*planner.Script{
		"hdr": {Steps: []func(planner.Request) planner.Response{planner.Answer("hi")}},
	})
	t.Setenv("TOOLBUS_MODEL", "openai:gpt-4.1")
	code, out, errOut := p.toolbus("run", "--id", "hdr", "hello")
	wantCode(t, "run", code, 0, out, errOut)
	wantContains(t, "run", out, `run hdr started: "hello"`, "(the planner's)")
	if strings.Contains(out, "openai") {
		t.Fatalf("the header names the client's TOOLBUS_MODEL:\n%s", out)
	}
}

// TestCLIRunWaitingNamesTheCommand: a run that waits for approval (exit 3) prints the
// command that decides each waiting call, and that command moves the run on.
func TestCLIRunWaitingNamesTheCommand(t *testing.T) {
	p := startOpsPipeline(t, map[string]*planner.Script{
		"run-waits": {Steps: []func(planner.Request) planner.Response{
			planner.Calls(opsCall("call_deploy", "deploy", `{"service":"api"}`)),
			planner.Answer("deployed"),
		}},
	}, deployForOps())
	code, out, errOut := p.toolbus("run", "--id", "run-waits", "deploy the api")
	wantCode(t, "run of a call that needs approval", code, 3, out, errOut)
	wantContains(t, "run of a call that needs approval", out,
		"decide call_deploy: toolbus approve run-waits call_deploy (or toolbus deny run-waits call_deploy --reason ...)\n")
	code, out, errOut = p.toolbus("approve", "run-waits", "call_deploy")
	wantCode(t, "the printed approve command", code, 0, out, errOut)
	p.waitStatus("run-waits", toolbus.RunCompleted)
}
