package faults_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/timeline"
)

// TestFaultFairShareDayTwo: day two with fair share on. The accounts layout of
// TestFaultDayTwoInFlight (operator mode, teams alpha and beta in accounts of their own,
// `toolbus admin`), set up with TOOLBUS_FAIR_SHARE=1, so every call is staged and
// released by the injector's scheduler. Tenant alice keeps runs of alpha's append_a in
// flight and tenant bob runs of beta's append_b, while the administrator rotates beta's
// credentials, revokes beta's tool and grants it again, and adds and removes a team,
// each with -push (checkDayTwoDisturbsNobody, whose own loop of alpha's runs must not
// stall). Every call of alpha's, alice's and the loop's, ran once and has exactly one
// result, and each ran at its first attempt (a call whose executor the push cut off is
// delivered again and runs at attempt 2: checked by the attempt, not by a clock). Then clients alice and bob, bound to their
// identities, ask what the scheduler holds (fairHeldProbes, across accounts).
func TestFaultFairShareDayTwo(t *testing.T) {
	suite(t)
	natsBin, toolbusBin, faultbusBin := binaries(t)
	e := &env{t: t, ctx: t.Context(), dir: t.TempDir(), natsBin: natsBin, toolbus: toolbusBin, faultbus: faultbusBin,
		cfg: events.Config{Replicas: 1, InstanceTTL: 2 * time.Second, FairShare: true}}
	t.Cleanup(e.dumpLogsOnFailure)
	node := &natsNode{name: "toolbus-nats-1", port: freePort(t), httpPort: freePort(t), store: filepath.Join(e.dir, "store")}
	genDir := filepath.Join(e.dir, "nats")
	creds := func(user string) string { return "TOOLBUS_NATS_CREDS=" + filepath.Join(genDir, user+".creds") }
	admin := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(e.ctx, toolbusBin, append(append([]string{"admin"}, args...), "-dir", genDir)...)
		cmd.Env = append(os.Environ(), "TOOLBUS_NATS_URL="+node.url())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("toolbus admin %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	admin("init", "-listen", "127.0.0.1:"+strconv.Itoa(node.port), "-store", node.store, "-core-wide")
	admin("add-team", "alpha", "append_a")
	admin("add-team", "beta", "append_b")
	admin("add-client", "alice", "alice")
	admin("add-client", "bob", "bob")
	node.conf = filepath.Join(genDir, "auth-jwt.conf")
	e.nodes = []*natsNode{node}
	e.startNode(node)
	e.eventually("nats-server on the generated config", time.Minute, func() error {
		nc, err := nats.Connect(node.url(), nats.UserCredentials(filepath.Join(genDir, "admin.creds")), nats.MaxReconnects(-1))
		if err != nil {
			return err
		}
		e.nc = nc
		return nil
	})
	t.Cleanup(e.nc.Close)
	p := startProc(t, e.dir, "init", toolbusBin, []string{"init", "--tools", "append_a,append_b"},
		[]string{"TOOLBUS_NATS_URL=" + node.url(), creds("admin"), "TOOLBUS_FAIR_SHARE=1", "TOOLBUS_INSTANCE_TTL=" + e.cfg.InstanceTTL.String()})
	p.expect()
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("toolbus init did not end:\n%s", p.logTail(20))
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("toolbus init exited %d:\n%s", code, p.logTail(20))
	}
	var err error
	if e.bus, err = events.Open(e.ctx, e.nc, e.cfg); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(e.dir, "side-effects")
	executor := func(inst, team, tool string) *proc {
		return e.faultbusRole("executor", inst, creds("executor-"+team), "TOOLBUS_TEAM="+team, "TOOLBUS_NATS_API_PREFIX=JS.core.API",
			"TOOLBUS_EXECUTOR_TOOLS="+tool, "TOOLBUS_FAULT_APPEND_TOOLS="+tool, "TOOLBUS_FAULT_APPEND_FILE="+file)
	}
	e.faultbusRole("planner", "planner-1", creds("planner"), "TOOLBUS_MODEL=append_a+append_b:2x4:500-1500")
	inj := e.toolbusRole("injector", "injector-1", creds("injector"))
	executor("alpha-1", "alpha", "append_a")
	beta1 := executor("beta-1", "beta", "append_b")
	e.waitReady([]string{"append_a", "append_b"}, "planner", "injector", "executor")
	e.eventually("the injector running the fair scheduler", time.Minute, func() error {
		if !strings.Contains(inj.logText(), "fair scheduler started") {
			return fmt.Errorf("no line says so")
		}
		return nil
	})

	// alice's and bob's runs, four of each in flight, until the day-two commands are done.
	contracts := map[string]toolbus.ToolContract{}
	for _, tool := range []string{"append_a", "append_b"} {
		if contracts[tool], err = callrun.Contract(e.ctx, e.bus, tool); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var aliceRuns []string
	var aliceErrs []string
	for w := range 8 {
		who, tool := "alice", "append_a"
		if w%2 == 1 {
			who, tool = "bob", "append_b"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				run := fmt.Sprintf("%s-%d-%03d", who, w, i)
				err := tenantCall(e, run, who, contracts[tool])
				if who == "alice" {
					mu.Lock()
					aliceRuns = append(aliceRuns, run)
					if err != nil {
						aliceErrs = append(aliceErrs, fmt.Sprintf("%s: %v", run, err))
					}
					mu.Unlock()
				}
			}
		}()
	}
	checkDayTwoDisturbsNobody(t, e, admin, toolbusBin, node.url(), genDir, file, beta1)
	close(stop)
	wg.Wait()
	if len(aliceErrs) > 0 {
		t.Errorf("alice's runs of alpha's tool while beta's credentials changed:\n  %s", strings.Join(aliceErrs, "\n  "))
	}
	checkOneResultEach(t, e, file, "append_a", aliceRuns)
	// What the scheduler holds, asked with the clients' shipped credentials across
	// accounts after day two.
	fairHeldProbes(t, node.url(), func(user string) string { return filepath.Join(genDir, user+".creds") }, true)
}

// tenantCall runs one call of tc's tool as who (a run of that one call) to its end.
func tenantCall(e *env, run, who string, tc toolbus.ToolContract) error {
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	rs := callrun.Build(callrun.Spec{RunID: run, Principal: toolbus.Principal{ID: who}, Tool: tc, Arguments: `{"ms":1}`, Via: "fair day two"}, time.Now())
	watch, err := runlog.Watch(ctx, e.bus, events.SubjectRun(run), true)
	if err != nil {
		return err
	}
	if err := e.bus.StartRun(ctx, events.Source("faults", "fair"), rs); err != nil {
		return err
	}
	o, err := callrun.Await(ctx, watch, time.Hour, func(*timeline.Printer) {}, nil)
	if err == nil && o.Ended.Status != toolbus.RunCompleted {
		err = fmt.Errorf("ended %s: %s", o.Ended.Status, o.Ended.Reason)
	}
	return err
}

// checkOneResultEach: each run's one call of tool ran once (its side effect), at its
// first attempt, and the stream holds exactly one result of it. No elapsed time is
// asserted (the queue's AckWait is the 2 s instance TTL here, which a busy machine may
// pass without any redelivery); the slowest is logged.
func checkOneResultEach(t *testing.T, e *env, sideEffects, tool string, runs []string) {
	t.Helper()
	q, err := e.bus.JetStream().Consumer(e.ctx, events.QueueStreamName(events.DefaultStream), events.ToolConsumer(tool))
	if err != nil {
		t.Fatal(err)
	}
	ackWait := q.CachedInfo().Config.AckWait
	ran := scanLines(t, sideEffects)
	var slowest time.Duration
	for _, run := range runs {
		if lines := ran[run+"/0/"+callrun.CallID]; len(lines) != 1 {
			t.Errorf("call of %s in run %s ran %d times, want once", tool, run, len(lines))
		} else if strings.Fields(lines[0])[2] != "1" {
			t.Errorf("call of %s in run %s was delivered again (it stalled until a redelivery): %q", tool, run, lines[0])
		}
		evs, err := runlog.Events(e.ctx, e.bus, run)
		if err != nil {
			t.Fatal(err)
		}
		var requested, finished time.Time
		results := 0
		for _, ev := range evs {
			switch ev.Meta.Type {
			case events.TypeToolRequested:
				requested = ev.Meta.Time
			case events.TypeToolFinished:
				results++
				finished = ev.Meta.Time
			}
		}
		if results != 1 {
			t.Errorf("run %s has %d results of its call, want exactly one", run, results)
			continue
		}
		slowest = max(slowest, finished.Sub(requested))
	}
	if len(runs) == 0 {
		t.Errorf("no run of %s during the commands", tool)
	}
	t.Logf("%d runs of %s during day two with fair share on, each call once; the slowest from request to result %s (AckWait %s)", len(runs), tool, slowest, ackWait)
}
