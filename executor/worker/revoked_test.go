package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// lockedBuffer is a log destination several goroutines write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestTeamAccountRevokedTool: a tool revoked from a team while its executor runs (the
// team account's imports of the tool's queue taken away by a configuration reload of a
// nats-server process (eventstest.AccountsProcess says why not in-process), as
// `toolbus admin revoke -push` takes them away by a pushed account) leaves the
// executor's instance record, and the executor logs one line naming it and why; its
// other tool is served all along (the control: a run calling it completes after the
// revocation). Granted again, the tool comes back in the record and its calls run, with
// no restart.
func TestTeamAccountRevokedTool(t *testing.T) {
	worker.SetReachEvery(t, 100*time.Millisecond)
	srv := eventstest.StartAccountsServer(t, "alpha", []string{"calc", "other"})
	intaketest.ServeIntake(t, srv.Connect(t, "core"), intake.Limits{})
	reload := func(tools ...string) {
		t.Helper()
		if err := srv.Regrant(tools); err != nil {
			t.Fatal(err)
		}
	}
	call := func(tool string) *planner.Script {
		return &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(toolbus.ToolCall{CallID: "c1", Tool: tool, Arguments: `{}`}), planner.Answer("done")}}
	}
	p := testpipe.StartOn(t, srv.Connect(t, "core"), 4*time.Minute, testpipe.ScriptByRun(map[string]*planner.Script{
		"rv-other": call("other"), "rv-calc": call("calc")}, nil))
	reg := executor.NewRegistry()
	for _, name := range []string{"calc", "other"} {
		if _, err := provision.Consumer(p.Ctx, p.Bus, provision.ToolConsumerConfig(name, 0, 0)); err != nil {
			t.Fatal(err)
		}
		if err := reg.Register(executor.Tool{Name: name, Description: "answers", InputSchema: json.RawMessage(`{"type":"object"}`),
			Func: func(context.Context, json.RawMessage) (any, error) { return name + " ran", nil }}); err != nil {
			t.Fatal(err)
		}
	}
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	teamBus, err := events.Open(p.Ctx, srv.Connect(t, "alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithLogger(log), executor.WithInstance("alpha-1")))
	w, err := worker.New(teamBus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-1", Logger: log, Grace: time.Second}, Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	p.Roles.Go("alpha-1", w.Run)
	p.WaitTools("calc", "other")
	recordLists := func(want ...string) {
		t.Helper()
		eventstest.Eventually(t, time.Minute, func() error {
			ins, err := p.Bus.Store().Instances(p.Ctx)
			if err != nil {
				return err
			}
			for _, in := range ins {
				if in.Team == "alpha" && in.Name == "alpha-1" && slices.Equal(slices.Sorted(slices.Values(in.Tools)), want) {
					return nil
				}
			}
			return fmt.Errorf("instance records %+v, want alpha-1 with %v", ins, want)
		})
	}
	recordLists("calc", "other")

	reload("other")
	recordLists("other")
	const line = "tool calc: this team's credentials no longer reach its queue (revoked?); not serving it"
	if n := strings.Count(logs.String(), line); n != 1 {
		t.Fatalf("the not-serving line logged %d times, want once:\n%s", n, logs.String())
	}
	// The control: the other tool is served as before.
	p.SubmitAs("rv-other", "alice", "go", toolbus.Limits{})
	p.WaitStatus("rv-other", toolbus.RunCompleted)

	reload("calc", "other")
	recordLists("calc", "other")
	p.SubmitAs("rv-calc", "alice", "go", toolbus.Limits{})
	p.WaitStatus("rv-calc", toolbus.RunCompleted)
	if !strings.Contains(logs.String(), "tool calc: its queue is reachable again") {
		t.Fatalf("no line says calc is served again:\n%s", logs.String())
	}
}
