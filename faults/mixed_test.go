package faults_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/callrun"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/testutil"
)

// nodeSDK returns the node command and the entry of the built TypeScript package
// (sdk/typescript/dist, made by its npm ci). Without them the test is skipped on a
// developer machine and fails under CI (CI set), where make test installs and builds them.
func nodeSDK(t *testing.T) (node, entry string) {
	t.Helper()
	sdk := filepath.Join("..", "sdk", "typescript")
	testutil.NeedNPMPackage(t, sdk, "dist/src/index.js", "node_modules/@nats-io/transport-node")
	entry, err := filepath.Abs(filepath.Join(sdk, "dist", "src", "index.js"))
	if err == nil {
		node, err = exec.LookPath("node")
	}
	if err != nil {
		t.Fatal(err)
	}
	return node, entry
}

// TestFaultMixedLanguages: a multi-team deployment of separate processes in the
// accounts layout, operator (JWT) mode, generated with `go run ./deploy/nats/gen
// -accounts -grants`, in which team alpha's tools are TypeScript (the package
// sdk/typescript, faults/testdata/mixed-executor.mjs run by node with alpha's .creds and
// TOOLBUS_NATS_API_PREFIX) and team beta's is Go (faultbus's append_b, with beta's);
// planner and injector are processes too. Runs whose steps call both tools complete,
// each call's side effect done exactly once: one call of alpha's append_ts fails its
// first attempt and its retry policy runs it again (the side effect once, at attempt 2,
// the result carrying the failed attempt); alpha's approve_ts waits for approval and
// runs once with the arguments a person edited (`toolbus approve --args`); append_ts
// reports progress, which is in the stream; and, with a second TypeScript instance up,
// the one that runs a call is killed (SIGKILL) mid-call and the other takes the call over
// once (the side effect once, by it, at attempt 2). Every run replays without a
// violation. The stream has its read mirror (`toolbus init`'s default), so it answers no
// direct get: the take-overs go by the claims' done marks.
func TestFaultMixedLanguages(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	nodeBin, sdkEntry := nodeSDK(t)
	a := newAccounts(t)
	e, node, genDir := a.env, a.nodes[0], a.genDir
	creds := func(user string) string { return "TOOLBUS_NATS_CREDS=" + a.creds(user) }

	// The administrator: the grants, the generated deployment, the server, the queues.
	grants := filepath.Join(e.dir, "grants.json")
	b, err := json.Marshal(map[string]any{"teams": map[string][]string{"alpha": {"append_ts", "approve_ts"}, "beta": {"append_b"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(grants, b, 0o600); err != nil {
		t.Fatal(err)
	}
	gen := exec.CommandContext(e.ctx, goTool(), "run", "./deploy/nats/gen", "-accounts", "-grants", grants, "-out", genDir,
		"-listen", "127.0.0.1:"+strconv.Itoa(node.port), "-store", node.store)
	gen.Dir = ".." // the repository root, where the docs run it
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("go run ./deploy/nats/gen: %v\n%s", err, out)
	}
	a.up("append_ts,approve_ts,append_b")
	cli := a.cli

	// The teams' executors and the core's workers.
	file, approveFile, failFile := filepath.Join(e.dir, "side-effects"), filepath.Join(e.dir, "approved"), filepath.Join(e.dir, "failed")
	failOnce, slow := "mix-0001/1/c0", "kill-0000/0/c0" // append_ts calls (call 0 of each step)
	tsStart := func(inst string) *proc {
		p := startProc(t, e.dir, inst, nodeBin, []string{filepath.Join("testdata", "mixed-executor.mjs")}, []string{
			"TOOLBUS_NATS_URL=" + node.url(), creds("executor-alpha"), "TOOLBUS_TEAM=alpha", "TOOLBUS_NATS_API_PREFIX=JS.core.API",
			"TOOLBUS_EXECUTOR_TOOLS=append_ts,approve_ts", "TOOLBUS_INSTANCE=" + inst, "TOOLBUS_INSTANCE_TTL=" + e.cfg.InstanceTTL.String(),
			"TOOLBUS_GRACE=2s", "TOOLBUS_SDK_ENTRY=" + sdkEntry, "TOOLBUS_FAULT_APPEND_FILE=" + file,
			"TOOLBUS_MIX_APPROVE_FILE=" + approveFile, "TOOLBUS_MIX_FAIL_FILE=" + failFile,
			"TOOLBUS_MIX_FAIL_ONCE=" + failOnce, "TOOLBUS_MIX_SLOW=" + slow,
		})
		e.mu.Lock()
		e.procs = append(e.procs, p)
		e.mu.Unlock()
		return p
	}
	waitLog := func(p *proc, what, line string) {
		e.eventually(p.name+" "+what, time.Minute, func() error {
			if !strings.Contains(p.logText(), line) {
				return fmt.Errorf("%s log: %s", p.name, p.logTail(3))
			}
			return nil
		})
	}
	tsExecutor := func(inst string) *proc {
		p := tsStart(inst)
		waitLog(p, "serving", "executor serving")
		return p
	}
	// The teams' executors start before any injector: their first writes (instance
	// records) find no write service, and they wait for one instead of exiting, in Go and
	// in TypeScript; a fleet may start in any order.
	beta1 := e.faultbusRole("executor", "beta-1", creds("executor-beta"), "TOOLBUS_TEAM=beta", "TOOLBUS_NATS_API_PREFIX=JS.core.API",
		"TOOLBUS_EXECUTOR_TOOLS=append_b", "TOOLBUS_FAULT_APPEND_TOOLS=append_b", "TOOLBUS_FAULT_APPEND_FILE="+file)
	alpha1 := tsStart("alpha-1")
	for _, p := range []*proc{beta1, alpha1} {
		waitLog(p, "waits for the write service", "bus write failed")
	}
	e.faultbusRole("planner", "planner-1", creds("planner"), "TOOLBUS_MODEL=append_ts+append_b:2x2:300-1200")
	e.toolbusRole("injector", "injector-1", creds("injector"))
	waitLog(alpha1, "serving", "executor serving")
	e.waitReady([]string{"append_ts", "approve_ts", "append_b"}, "planner", "injector", "executor")

	// Runs calling both teams' tools (one of alpha's calls retried), and a call of
	// approve_ts, which waits for a person, who edits its arguments.
	runs := runIDs("mix", 4)
	e.submit(runs)
	const approveRun = "mix-approve"
	cli("call", callrun.ExitApproval, "call", "--id", approveRun, "--principal", "faults", "approve_ts", `{"label":"from-the-model"}`)
	cli("approve", 0, "approve", approveRun, callrun.CallID, "--args", `{"label":"edited"}`, "--who", "faults", "--reason", "fault suite")
	waitRunsCompleted(e, append([]string{approveRun}, runs...), 2*time.Minute)

	// The kill: a second instance joins, one of the two runs the slow call of kill-0000
	// and is killed (SIGKILL) mid-call; the other takes the call over.
	alpha := map[string]*proc{"alpha-1": alpha1, "alpha-2": tsExecutor("alpha-2")}
	e.submit([]string{"kill-0000"})
	claims, err := e.bus.JetStream().KeyValue(e.ctx, store.BucketClaims)
	if err != nil {
		t.Fatal(err)
	}
	var holder, taker string
	e.eventually("an alpha instance runs "+slow, time.Minute, func() error {
		ctx, cancel := e.op()
		defer cancel()
		entry, err := claims.Get(ctx, store.ClaimKey("append_ts", "kill-0000", 0, "c0"))
		if err != nil {
			return err
		}
		var c store.Claim
		if err := json.Unmarshal(entry.Value(), &c); err != nil {
			return err
		}
		if alpha[c.Instance] == nil {
			return fmt.Errorf("claimed: %s", entry.Value())
		}
		holder = c.Instance
		return nil
	})
	taker = map[string]string{"alpha-1": "alpha-2", "alpha-2": "alpha-1"}[holder]
	if n := e.count(events.SubjectToolFinished("kill-0000", "append_ts")); n != 0 {
		t.Fatalf("%s finished before the kill (%d results): nothing to take over", slow, n)
	}
	alpha[holder].kill()
	waitRunsCompleted(e, []string{"kill-0000"}, 2*time.Minute)
	e.checkProcs()

	// Every call ran exactly once, in the stream and by its side effect.
	all := append(append([]string{}, runs...), "kill-0000")
	tl := e.tally()
	st := e.checkRuns(tl, all, 2, 2)
	checkSideEffects(t, file, all, 2, 2)
	effects := scanLines(t, file)
	// The retry: attempt 1 failed (no side effect), attempt 2 did it; the result says so.
	if fails := scanLines(t, failFile); len(fails) != 1 || len(fails[failOnce]) != 1 {
		t.Errorf("failed attempts %v, want one of %s", fails, failOnce)
	}
	if f := strings.Fields(first(effects[failOnce])); len(f) < 3 || f[2] != "2" {
		t.Errorf("side effect of the retried call %s: %q, want at attempt 2", failOnce, effects[failOnce])
	}
	if fs := tl["mix-0001"].finished[callKey{1, "c0"}]; len(fs) != 1 || fs[0].Attempt != 2 || len(fs[0].Retries) != 1 || fs[0].Retries[0].Error.Code != "flaky" {
		t.Errorf("result of the retried call %s: %+v, want attempt 2 with one failed attempt (flaky)", failOnce, fs)
	}
	// The take-over: the killed instance's call, done once by the other at attempt 2.
	if f := strings.Fields(first(effects[slow])); len(f) < 3 || f[1] != taker || f[2] != "2" {
		t.Errorf("side effect of the killed call %s: %q, want once by %s at attempt 2 (%s was killed)", slow, effects[slow], taker, holder)
	}
	if fs := tl["kill-0000"].finished[callKey{0, "c0"}]; len(fs) != 1 || fs[0].Executor != taker || fs[0].Attempt != 2 {
		t.Errorf("result of the killed call %s: %+v, want %s's at attempt 2", slow, fs, taker)
	}
	// Progress of alpha's tool is in the stream, the killed call's included.
	if n := e.count(events.SubjectToolProgress("kill-0000", "append_ts")); n == 0 {
		t.Errorf("no tool.progress of append_ts in kill-0000 (all runs: %d)", e.count(events.SubjectToolProgress("*", "append_ts")))
	}
	// The approval: the call ran once, with the edited arguments.
	approved := scanLines(t, approveFile)
	key := approveRun + "/0/" + callrun.CallID
	if len(approved) != 1 || len(approved[key]) != 1 || !strings.HasSuffix(approved[key][0], " approve_ts edited") {
		t.Errorf("approve_ts side effects %v, want one for %s with the edited label", approved, key)
	}
	if fs := tl[approveRun].finished[callKey{0, callrun.CallID}]; len(fs) != 1 || fs[0].Status != toolbus.StatusSucceeded ||
		fs[0].Human == nil || fs[0].Human.Kind != toolbus.DecisionEdited {
		t.Errorf("result of the approved call: %+v, want succeeded with the person's edit", fs)
	}
	for _, run := range append(all, approveRun) {
		evs, err := runlog.Events(e.ctx, e.bus, run)
		if err != nil {
			t.Fatal(err)
		}
		if rep := audit.Analyze(run, evs); len(rep.Violations) != 0 || rep.Status != "completed" {
			t.Errorf("run %s: %s, violations %+v", run, rep.Status, rep.Violations)
		}
	}
	t.Logf("%s", st)
}

func first(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return lines[0]
}

// waitRunsCompleted waits until each run completed; another outcome fails the test (a
// run that waits for approval goes on waiting).
func waitRunsCompleted(e *env, runs []string, d time.Duration) {
	e.t.Helper()
	e.eventually("runs completed", d, func() error {
		var left []string
		for _, run := range runs {
			c := e.counts(events.SubjectPrefix + "." + run + ".run.*")
			if c == nil {
				return fmt.Errorf("server not answering")
			}
			for subj := range c {
				status := toolbus.RunStatus(subj[strings.LastIndexByte(subj, '.')+1:])
				if status.Terminal() && status != toolbus.RunCompleted {
					e.t.Fatalf("run %s ended %s: %s", run, status, e.lastData(subj))
				}
			}
			if c[events.SubjectRunEnded(run, toolbus.RunCompleted)] == 0 {
				left = append(left, fmt.Sprintf("%s (%v)", run, c))
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%d of %d runs not completed: %s", len(left), len(runs), strings.Join(left, ", "))
		}
		return nil
	})
}
