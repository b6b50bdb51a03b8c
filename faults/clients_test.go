package faults_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
)

// cliResult is what one `toolbus` command of a client printed and how it exited.
type cliResult struct {
	code int
	out  string
}

// clientCLI runs `toolbus args...` as a client in its own account (the accounts layout's
// client user of that name, reading through the core's read service as the identity of
// the same name, which the commands act as by default: $USER is someone else) and returns its exit code and output. A
// command still running after d is interrupted (SIGINT), as a person stops `toolbus tail`.
func (e *env) clientCLI(user string, d time.Duration, args ...string) cliResult {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, d)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.toolbus, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 20 * time.Second
	cmd.Env = append(childEnv([]string{"TOOLBUS_NATS_URL=" + e.urls(), "TOOLBUS_NATS_USER=" + user, "TOOLBUS_NATS_PASSWORD=" + user,
		"TOOLBUS_NATS_READ_PREFIX=" + events.ReadAPIPrefix(user), "TOOLBUS_LOG_LEVEL=warn"}), "USER=operator")
	dieWithParent(cmd)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) && ctx.Err() == nil {
		e.t.Fatalf("toolbus %s as %s: %v\n%s", strings.Join(args, " "), user, err, out)
	}
	return cliResult{code: cmd.ProcessState.ExitCode(), out: string(out)}
}

// want fails the test unless the command exited code and printed every one of has and
// none of hasNot.
func (r cliResult) want(t *testing.T, what string, code int, has []string, hasNot ...string) {
	t.Helper()
	ok := r.code == code
	for _, s := range has {
		ok = ok && strings.Contains(r.out, s)
	}
	for _, s := range hasNot {
		ok = ok && !strings.Contains(r.out, s)
	}
	if !ok {
		t.Errorf("%s: exit %d, want %d with %q and without %q:\n%s", what, r.code, code, has, hasNot, r.out)
	}
}

// TestFaultClientAccountsCLI: every client command of `toolbus` in a client account of
// its own, with separate processes: a nats-server on the accounts layout (core user
// core, client accounts alice and bob, each bound to the identity of its name), `toolbus
// init`, and `toolbus injector` (which serves the read service), `toolbus planner`
// (script:approval: a restart_service call that needs approval) and `toolbus executor`
// in the core account. As alice, `toolbus run` starts her run and stops where it waits
// for approval; bob's `toolbus approve` of it finds no such run (exactly as for a run that
// does not exist) and, in alice's name, is refused as not bound; his start under her run id
// is told the id is taken, with no replay hint (hers has one); bob's replay, runs, tail
// and cancel see nothing of it; alice approves, and her tail, replay and runs show her
// run to its end; her second run, which bob cannot cancel, she cancels. Bob's own run
// works the same way, out of alice's sight. What cannot work in a client account (tail
// of every run) says why; the tools listed are those the core offers. `toolbus mcp
// --http` runs as a process on alice's credentials (checkMCPDoorProcess). The restart runs once per run.
func TestFaultClientAccountsCLI(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	start := time.Now()
	natsBin, toolbusBin, faultbusBin := binaries(t)
	e := &env{t: t, ctx: t.Context(), dir: t.TempDir(), natsBin: natsBin, toolbus: toolbusBin, faultbus: faultbusBin,
		cfg: events.Config{Replicas: 1, InstanceTTL: 2 * time.Second}}
	t.Cleanup(e.dumpLogsOnFailure)
	node := &natsNode{name: "n1", port: freePort(t), httpPort: freePort(t), store: filepath.Join(e.dir, "store"),
		conf: filepath.Join(e.dir, "tenants.conf")}
	conf := eventstest.TenantsConf(node.store, nil, map[string][]string{"alice": {"alice"}, "bob": {"bob"}})
	if err := os.WriteFile(node.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	e.nodes = []*natsNode{node}
	e.startNode(node)
	e.eventually("nats-server on the tenants' config", time.Minute, func() error {
		nc, err := nats.Connect(node.url(), nats.UserInfo("core", "core"), nats.MaxReconnects(-1))
		if err != nil {
			return err
		}
		e.nc = nc
		return nil
	})
	t.Cleanup(e.nc.Close)
	core := []string{"TOOLBUS_NATS_USER=core", "TOOLBUS_NATS_PASSWORD=core"}
	initProc := startProc(t, e.dir, "init", toolbusBin, []string{"init"}, append([]string{"TOOLBUS_NATS_URL=" + node.url(), "TOOLBUS_INSTANCE_TTL=" + e.cfg.InstanceTTL.String()}, core...))
	initProc.expect()
	select {
	case <-initProc.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("toolbus init did not end:\n%s", initProc.logTail(20))
	}
	if code := initProc.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("toolbus init exited %d:\n%s", code, initProc.logTail(20))
	}
	var err error
	if e.bus, err = events.Open(e.ctx, e.nc, e.cfg); err != nil {
		t.Fatal(err)
	}
	e.toolbusRole("injector", "injector-1", core...)
	e.toolbusRole("planner", "planner-1", append([]string{"TOOLBUS_MODEL=script:approval"}, core...)...)
	e.toolbusRole("executor", "exec-1", core...)
	e.waitReady([]string{"lookup_incident", "restart_service"}, "planner", "injector", "executor")
	e.eventually("the read service answers alice", time.Minute, func() error {
		if r := e.clientCLI("alice", time.Minute, "runs"); r.code != 0 {
			return errors.New(r.out)
		}
		return nil
	})

	const minute = time.Minute
	for _, who := range []string{"alice", "bob"} {
		run := who + "-1"
		e.clientCLI(who, minute, "run", "--id", run, "--tools", "lookup_incident,restart_service", "What is wrong with INC-001?").
			want(t, who+"'s run", 3, []string{"waiting_for_approval", "pending: call_restart restart_service"})
	}
	// Bob finds nothing of alice's run: what he is told is what a run that does not exist
	// tells him. In alice's name his account may do nothing.
	e.clientCLI("bob", minute, "approve", "alice-1", "call_restart").want(t, "bob approves alice's call", 1, []string{"run alice-1 not found"})
	e.clientCLI("bob", minute, "approve", "nobody-1", "call_restart").want(t, "bob approves an absent run's call", 1, []string{"run nobody-1 not found"})
	// His start under her run id: the id is taken (a caller-chosen id tells that much),
	// with nothing of her run and no replay his credentials cannot make; hers (the
	// control) points at the run she can read.
	e.clientCLI("bob", minute, "run", "--id", "alice-1", "hi").want(t, "bob's start under alice's run id", 2,
		[]string{`run id "alice-1" already exists; choose another id`}, "replay", "restart", "INC-001")
	e.clientCLI("alice", minute, "run", "--id", "alice-1", "hi").want(t, "alice's start under her own run id", 2,
		[]string{`run id "alice-1" already exists; choose another id (toolbus replay alice-1 shows that run)`})
	for _, args := range [][]string{
		{"approve", "alice-1", "call_restart", "--who", "alice"},
		{"deny", "alice-1", "call_restart", "--message", "no", "--who", "alice"},
		{"cancel", "alice-1", "--who", "alice"},
		{"answer", "alice-1", "call_restart", "{}", "--who", "alice"},
		{"run", "--id", "bob-as-alice", "--principal", "alice", "hello"},
	} {
		e.clientCLI("bob", minute, args...).want(t, "bob: "+strings.Join(args, " "), 1, []string{"not bound to the identity alice"}, "approved", "cancel requested")
	}
	e.clientCLI("bob", minute, "cancel", "alice-1").want(t, "bob cancels alice's run", 1, []string{"run alice-1 not found"})
	e.clientCLI("bob", minute, "replay", "alice-1").want(t, "bob replays alice's run", 1, []string{"run alice-1 not found"}, "restart_service")
	e.clientCLI("bob", minute, "runs").want(t, "bob lists runs", 0, []string{"bob-1"}, "alice-1")
	e.clientCLI("bob", 3*time.Second, "tail", "alice-1", "--all").want(t, "bob tails alice's run", 0, []string{"run alice-1 not started yet"}, "restart_service", "INC-001")
	e.clientCLI("alice", minute, "tail", "--all").want(t, "alice tails every run", 1, []string{"a client account follows one run at a time"})
	e.clientCLI("alice", minute, "tools").want(t, "alice lists the tools", 0, []string{"lookup_incident", "offered"})
	e.clientCLI("alice", minute, "run", "--tools", "nope", "hello").want(t, "alice allows an unknown tool", 2, []string{"no executor published nope"})

	// Each decides on their own run, with an edit checked against the catalog's schema.
	for _, who := range []string{"alice", "bob"} {
		run := who + "-1"
		e.clientCLI(who, minute, "approve", run, "call_restart", "--args", `{"service":"auth-api"}`).
			want(t, who+" approves", 0, []string{"approved with edited arguments call call_restart restart_service"})
		e.clientCLI(who, minute, "tail", run, "--all").want(t, who+" tails the run", 0, []string{"completed"}, "not started")
		e.clientCLI(who, minute, "replay", run).want(t, who+" replays the run", 0, []string{"invariants: ok", "approval.granted", "by " + who})
		other := map[string]string{"alice": "bob-1", "bob": "alice-1"}[who]
		e.clientCLI(who, minute, "runs").want(t, who+" lists the runs", 0, []string{run + " ", "completed"}, other)
		e.clientCLI(who, minute, "cancel", run).want(t, who+" cancels the ended run", 1, []string{"already ended: completed"})
	}
	// A run in flight: bob cannot cancel it, alice can.
	e.clientCLI("alice", minute, "run", "--id", "alice-2", "What is wrong with INC-001?").want(t, "alice's second run", 3, []string{"waiting_for_approval"})
	e.clientCLI("bob", minute, "cancel", "alice-2").want(t, "bob cancels alice's run in flight", 1, []string{"run alice-2 not found"})
	e.clientCLI("alice", minute, "cancel", "alice-2", "--reason", "not now").want(t, "alice cancels her run", 0, []string{"cancel requested for run alice-2"})
	e.clientCLI("alice", minute, "call", "--id", "alice-call", "lookup_incident", `{"incident_id":"INC-001"}`).
		want(t, "alice calls a tool", 0, []string{"INC-001"})
	e.checkMCPDoorProcess()
	for _, run := range []string{"alice-1", "bob-1", "alice-call"} {
		e.eventually(run+" completed", minute, func() error {
			if n := e.count(events.SubjectRunEnded(run, toolbus.RunCompleted)); n != 1 {
				return fmt.Errorf("%d run.completed", n)
			}
			return nil
		})
	}
	e.eventually("alice-2 cancelled", minute, func() error {
		if n := e.count(events.SubjectRunEnded("alice-2", toolbus.RunCancelled)); n != 1 {
			return fmt.Errorf("%d run.cancelled", n)
		}
		return nil
	})
	for _, run := range []string{"alice-1", "bob-1"} {
		if n := e.count(events.SubjectToolFinished(run, "restart_service")); n != 1 {
			t.Errorf("run %s: restart_service finished %d times, want once", run, n)
		}
	}
	e.checkProcs()
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}
