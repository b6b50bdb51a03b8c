package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
)

// callJSON is the output of toolbus call --json.
type callJSON struct {
	RunID  string             `json:"run_id"`
	Result toolbus.ToolResult `json:"result"`
}

// TestCallEmbedded: toolbus call with no server runs the call on the embedded default,
// prints the output, exits by status, and leaves an audited run in the local store.
func TestCallEmbedded(t *testing.T) {
	noServerEnv(t)
	code, out, errOut := cli(t, "call", "calculator", `{"expression":"6*7"}`)
	wantCode(t, "call calculator", code, 0, out, errOut)
	wantContains(t, "call calculator", out, "42")
	if errOut != "" {
		t.Fatalf("call logged on stderr without -v:\n%s", errOut)
	}

	code, out, errOut = cli(t, "call", "--json", "--id", "call-embedded", "calculator", `{"expression":"2+3"}`)
	wantCode(t, "call --json", code, 0, out, errOut)
	var got callJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("call --json: %v\n%s", err, out)
	}
	if got.RunID != "call-embedded" || got.Result.Status != toolbus.StatusSucceeded || got.Result.Tool != "calculator" || !strings.Contains(string(got.Result.Output), "5") {
		t.Fatalf("call --json = %+v", got)
	}
	code, out, errOut = cli(t, "replay", "call-embedded")
	wantCode(t, "replay of the call", code, 0, out, errOut)
	wantContains(t, "replay of the call", out, "run call-embedded: completed", "calculator", "invariants: ok")

	stdinOf = strings.NewReader(`{"incident_id":"INC-404"}`)
	t.Cleanup(func() { stdinOf = os.Stdin })
	code, out, errOut = cli(t, "call", "lookup_incident", "-")
	wantCode(t, "call of a failing tool", code, callrun.ExitFailed, out, errOut)
	wantContains(t, "call of a failing tool", errOut, "lookup_incident failed (incident_not_found)", "toolbus replay call-")

	code, out, errOut = cli(t, "call", "calculator", `{"nope":1}`)
	wantCode(t, "call with invalid arguments", code, callrun.ExitRejected, out, errOut)
	wantContains(t, "call with invalid arguments", errOut, "calculator rejected (invalid_arguments)")

	code, out, errOut = cli(t, "call", "nosuch")
	wantCode(t, "call of an unknown tool", code, callrun.ExitUsage, out, errOut)
	wantContains(t, "call of an unknown tool", errOut, `unknown tool "nosuch"`, "calculator")

	code, out, errOut = cli(t, "call", "calculator", `{not json`)
	wantCode(t, "call with bad JSON", code, callrun.ExitUsage, out, errOut)
}

// TestCallServer: toolbus call against a running pipeline (TOOLBUS_NATS_URL): the
// result, a timeout, and a call that needs approval (exit 3, then approved; or never
// decided: its approval timed out).
func TestCallServer(t *testing.T) {
	p := startOpsPipeline(t, nil, deployForOps())
	code, out, errOut := p.toolbus("call", "calculator", `{"expression":"2^10"}`)
	wantCode(t, "call", code, 0, out, errOut)
	wantContains(t, "call", out, "1024")

	code, out, errOut = p.toolbus("call", "sleep", `{"ms":60000}`, "--json", "--timeout", "500ms")
	if code == 0 {
		t.Fatalf("a call past its deadline succeeded:\n%s", out)
	}
	wantContains(t, "call past its deadline", out+errOut, "call-")

	code, out, errOut = p.toolbus("call", "--id", "call-deploy", "deploy", `{"service":"api"}`)
	wantCode(t, "call of a tool that needs approval", code, callrun.ExitApproval, out, errOut)
	wantContains(t, "call of a tool that needs approval", out, "toolbus approve call-deploy call_0")
	code, out, errOut = p.toolbus("approve", "call-deploy", "call_0")
	wantCode(t, "approve", code, 0, out, errOut)
	p.waitStatus("call-deploy", toolbus.RunCompleted)

	// Nobody decides before the run's deadline: the call's result says that the
	// approval timed out (not that no executor answered).
	code, out, errOut = p.toolbus("call", "--id", "call-undecided", "--timeout", "2s", "deploy", `{"service":"api"}`)
	wantCode(t, "call of a tool that needs approval", code, callrun.ExitApproval, out, errOut)
	p.waitStatus("call-undecided", toolbus.RunLimitReached)
	code, out, errOut = p.toolbus("replay", "call-undecided")
	wantCode(t, "replay of the undecided call", code, 0, out, errOut)
	wantContains(t, "replay of the undecided call", out, "tool.finished call_0 deploy: timed_out timeout (the approval timed out: nobody approved or denied")

	code, out, errOut = p.toolbus("call", "fail", `{"message":"boom"}`)
	wantCode(t, "call of fail", code, callrun.ExitFailed, out, errOut)
}

// TestScriptFileDrivesACustomTool: a script file (TOOLBUS_MODEL=script:<file>) drives
// a custom tool end to end through the binary's planner and injector, with no key;
// toolbus run --model names another script for one run, and a model the planner cannot
// serve fails that run saying why.
func TestScriptFileDrivesACustomTool(t *testing.T) {
	dir := t.TempDir()
	greetScript := filepath.Join(dir, "greet.json")
	if err := os.WriteFile(greetScript, []byte(`{
  "steps": [
    {"say": "Let me greet Ada.", "calls": [{"id": "g", "tool": "greet", "arguments": {"name": "Ada"}}]},
    {"say": "Done: {{result:g}}"}
  ]
}`), 0o600); err != nil {
		t.Fatal(err)
	}
	otherScript := filepath.Join(dir, "twice.json")
	if err := os.WriteFile(otherScript, []byte(`{"name": "twice", "steps": [
    {"calls": [{"tool": "greet", "arguments": {"name": "Bob"}}, {"tool": "greet", "arguments": {"name": "Eve"}}]},
    {"say": "{{results}}"}
  ]}`), 0o600); err != nil {
		t.Fatal(err)
	}

	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 3*time.Minute)
	bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg := executor.NewRegistry()
	type in struct {
		Name string `json:"name"`
	}
	type outT struct {
		Greeting string `json:"greeting"`
	}
	if err := executor.RegisterFunc(reg, executor.Tool{Name: "greet", Description: "Greets someone by name."}, func(_ context.Context, a in) (outT, error) {
		return outT{Greeting: "hello, " + a.Name}, nil
	}); err != nil {
		t.Fatal(err)
	}
	logs := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	w, err := worker.New(bus, testutil.Must(executor.New(reg)), worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "greeter", Logger: log}})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = w.Run(wctx) }()
	// The planner offers only tools a live executor serves: wait until the catalog
	// says the greeter serves greet (the planner started below reads it at its start).
	eventstest.Eventually(t, time.Minute, func() error {
		cat, err := bus.Store().WatchCatalog(ctx, nil)
		if err != nil {
			return err
		}
		if _, ok := cat.Lookup("greet"); !ok {
			return fmt.Errorf("greet not in the catalog with a live executor yet")
		}
		return nil
	})

	t.Setenv("TOOLBUS_NATS_URL", srv.URL)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	t.Setenv("TOOLBUS_MODEL", "script:"+greetScript)
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	cfg, err := node.Load()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer wg.Done()
		if err := node.RunRoles(wctx, cfg, bus, log, "planner", "injector"); err != nil && wctx.Err() == nil {
			t.Errorf("roles: %v", err)
		}
	}()

	var out, errOut strings.Builder
	code := run(ctx, []string{"run", "--id", "script-1", "Greet Ada"}, &out, &errOut)
	wantCode(t, "run with the script file", code, 0, out.String(), errOut.String())
	wantContains(t, "run with the script file", out.String(), "model script:greet (the planner's)", "-> g greet(", `answer: Done: {"greeting":"hello, Ada"}`)

	out.Reset()
	errOut.Reset()
	code = run(ctx, []string{"run", "--id", "script-2", "--model", "script:" + otherScript, "Greet two"}, &out, &errOut)
	wantCode(t, "run --model", code, 0, out.String(), errOut.String())
	wantContains(t, "run --model", out.String(), "model twice (asked for by the run: a script shipped with the run (",
		"greet: {\"greeting\":\"hello, Bob\"}", "greet: {\"greeting\":\"hello, Eve\"}")
	evs, err := runlog.Events(ctx, bus, "script-2")
	if err != nil {
		t.Fatal(err)
	}
	var recorded []string
	for _, ev := range evs {
		if ev.Meta.Type == events.TypeModelResponded {
			var mr toolbus.ModelResponded
			if err := ev.Decode(&mr); err != nil {
				t.Fatal(err)
			}
			recorded = append(recorded, mr.Model)
		}
	}
	if fmt.Sprint(recorded) != "[twice twice]" {
		t.Fatalf("model.responded of the run record %v, want the run's model twice", recorded)
	}
	// The script file travelled with the run (a planner on another host serves it).
	rs, err := bus.RunStarted(ctx, "script-2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rs.Model, `script:{"name":"twice","steps":[`) {
		t.Fatalf("run.started names model %q, want the script itself", rs.Model)
	}

	out.Reset()
	errOut.Reset()
	code = run(ctx, []string{"run", "--id", "script-3", "--model", "openai:gpt-4.1", "Greet"}, &out, &errOut)
	wantCode(t, "run --model the planner cannot serve", code, 1, out.String(), errOut.String())
	wantContains(t, "run --model the planner cannot serve", out.String(), "model_error", `names model "openai:gpt-4.1", which this planner cannot serve`, "OPENAI_API_KEY")

	out.Reset()
	errOut.Reset()
	missing := filepath.Join(dir, "missing.json")
	code = run(ctx, []string{"run", "--id", "script-4", "--model", "script:" + missing, "Greet"}, &out, &errOut)
	wantCode(t, "run --model of a missing script file", code, 1, out.String(), errOut.String())
	wantContains(t, "run --model of a missing script file", out.String(), "model_error", missing)
	// A user's mistake ends the run saying why, and is no error of the planner's: once
	// the planner is done with every request (none pending, none awaiting its ack), its
	// log has no failed handler, no poison message, nothing at level ERROR.
	eventstest.Eventually(t, time.Minute, func() error {
		cons, err := bus.EventStream().Consumer(ctx, events.ConsumerPlanner)
		if err != nil {
			return err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending+uint64(info.NumAckPending) > 0 {
			return fmt.Errorf("the planner has %d request(s) pending, %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		return nil
	})
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "handler failed") || strings.Contains(line, "poison message") {
			t.Errorf("the planner logged a failed model name as its own failure: %s", line)
		}
	}
}

// TestTailLocalStore: with no TOOLBUS_NATS_URL, tail reads the local store as runs and
// replay do: a run's stored events, or every run's, then it stops (nothing else writes
// there); a run the store lacks exits 1. A command that must reach a server (approve)
// says which command needs TOOLBUS_NATS_URL, not "this role".
func TestTailLocalStore(t *testing.T) {
	noServerEnv(t)
	code, out, errOut := cli(t, "call", "--id", "tail-local", "calculator", `{"expression":"6*7"}`)
	wantCode(t, "call calculator", code, 0, out, errOut)

	code, out, errOut = cli(t, "tail", "tail-local")
	wantCode(t, "tail of a stored run", code, 0, out, errOut)
	wantContains(t, "tail of a stored run", out, "run tail-local started", "<- call_0 calculator: succeeded", "run tail-local: completed")
	wantContains(t, "tail of a stored run", errOut, "local store")

	code, out, errOut = cli(t, "tail")
	wantCode(t, "tail of the local store", code, 0, out, errOut)
	wantContains(t, "tail of the local store", out, "tail-local run tail-local started", "tail-local run tail-local: completed")

	code, out, errOut = cli(t, "tail", "no-such-run")
	wantCode(t, "tail of a run the store lacks", code, 1, out, errOut)
	wantContains(t, "tail of a run the store lacks", errOut, "run no-such-run not found in the local store")

	code, out, errOut = cli(t, "approve", "tail-local", "call_0")
	wantCode(t, "approve with no server", code, 1, out, errOut)
	wantContains(t, "approve with no server", errOut, "toolbus approve: TOOLBUS_NATS_URL is not set: this command connects")
	if strings.Contains(errOut, "role") {
		t.Errorf("approve calls itself a role: %s", errOut)
	}
}
