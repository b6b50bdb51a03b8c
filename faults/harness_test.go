package faults_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/internal/testutil"
)

// The suite runs real processes: a nats-server built from the module dependency, the
// toolbus binary (cmd/toolbus) and faultbus (faults/internal/faultbus: the planner with a
// checking script model and an executor with a cross-process side effect). It looks at
// the outcome only through the JetStream stream and buckets.

// suite skips tests of the full suite unless TOOLBUS_FAULTS=1.
func suite(t *testing.T) {
	t.Helper()
	if os.Getenv("TOOLBUS_FAULTS") != "1" {
		t.Skip("fault suite: set TOOLBUS_FAULTS=1 (make test-faults)")
	}
}

var bins struct {
	once                    sync.Once
	dir                     string
	nats, toolbus, faultbus string
	err                     error
}

// TestMain runs three tests at a time where the command line does not say (make test:
// -p 4 beside other packages): the tests wait on processes, leases and redeliveries
// far more than they compute, and at two at a time (two cores) those waits add up to
// the package's critical path. Not more: they all start their processes at once when
// the binaries are built, and at four on a machine loaded far past its cores a team
// executor's first connection timed out (the server took 2.7 s over its CONNECT). The
// full suite's tests (TOOLBUS_FAULTS=1) are not parallel: they run one at a time.
func TestMain(m *testing.M) {
	testutil.RaiseParallel(3)
	code := m.Run()
	if bins.dir != "" {
		_ = os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// binaries builds the toolbus and faultbus binaries once per test process. Under plain
// `go test -race` they are built with -race too, so they reuse the packages the test
// build compiled; the full suite builds them without it (the load test measures the
// real thing). nats-server is never raced: the one binary the other packages' tests run
// (testutil.NATSServerBinary, built once per machine without -race), so that no test
// pays the race detector's CPU in the server every process talks to (on two loaded
// cores a raced server once took 2.7 s over a CONNECT), and its own races are not ours.
func binaries(t testing.TB) (natsBin, toolbusBin, faultbusBin string) {
	t.Helper()
	bins.once.Do(func() {
		start := time.Now()
		bins.dir, bins.err = os.MkdirTemp("", "toolbus-faults-bin-")
		if bins.err != nil {
			return
		}
		flags := []string{"build"}
		if raceEnabled && os.Getenv("TOOLBUS_FAULTS") != "1" {
			flags = append(flags, "-race")
		}
		targets := []struct {
			out *string
			pkg string
		}{
			{&bins.toolbus, "github.com/toolbus/toolbus/cmd/toolbus"},
			{&bins.faultbus, "github.com/toolbus/toolbus/faults/internal/faultbus"},
		}
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []string
		)
		wg.Go(func() {
			var err error
			if bins.nats, err = testutil.NATSServerBinary(); err != nil {
				mu.Lock()
				errs = append(errs, err.Error())
				mu.Unlock()
			}
		})
		for i, tg := range targets {
			*tg.out = filepath.Join(bins.dir, []string{"toolbus", "faultbus"}[i])
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(goTool(), append(flags, "-o", *tg.out, tg.pkg)...)
				if out, err := cmd.CombinedOutput(); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("go build %s: %v\n%s", tg.pkg, err, out))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			bins.err = errors.New(strings.Join(errs, "\n"))
			return
		}
		fmt.Fprintf(os.Stderr, "faults: built toolbus and faultbus (%v), and nats-server without -race, in %v\n", flags, time.Since(start).Round(time.Millisecond))
	})
	if bins.err != nil {
		t.Fatalf("building the binaries: %v", bins.err)
	}
	return bins.nats, bins.toolbus, bins.faultbus
}

// The go command, and a child's life tied to the test process's (shared with the tests
// that run a nats-server process beside them).
var goTool, dieWithParent = testutil.GoTool, testutil.DieWithParent

// proc is a child process with its output in a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}

	mu       sync.Mutex
	expected bool // the test stopped or killed it (or expects it to die)
}

// childEnv is the parent's environment without TOOLBUS_* and NATS_* variables, plus env.
func childEnv(env []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TOOLBUS_") || strings.HasPrefix(kv, "NATS_") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, env...)
}

func startProc(t testing.TB, logDir, name, bin string, args, env []string) *proc {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv(env)
	cmd.Stdout, cmd.Stderr = f, f
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *proc) expect() {
	p.mu.Lock()
	p.expected = true
	p.mu.Unlock()
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// unexpectedExit reports whether the process ended without the test wanting it.
func (p *proc) unexpectedExit() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.expected && p.exited()
}

// kill sends SIGKILL (kill -9) to the process and waits for it.
func (p *proc) kill() {
	p.expect()
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// stop sends SIGTERM and waits up to d, then kills.
func (p *proc) stop(d time.Duration) {
	p.expect()
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(d):
		p.kill()
	}
}

// signaled returns the signal that ended the process, if one did.
func (p *proc) signaled() (syscall.Signal, bool) {
	if !p.exited() || p.cmd.ProcessState == nil {
		return 0, false
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return ws.Signal(), true
}

func (p *proc) logText() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func (p *proc) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.logText(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// natsNode is one nats-server process running a config file of deploy/nats (copied,
// see deployCopy), with command-line flags overriding its name and addresses.
type natsNode struct {
	name        string
	port        int
	httpPort    int
	clusterPort int
	conf        string
	store       string
	proc        *proc
}

func (n *natsNode) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

// handedOut are the ports freePort returned: the kernel may give a port just closed to
// the next listener, and two ports of one server (client and monitor) that came out
// the same made it fail to start ("address already in use").
var handedOut sync.Map

// freePort returns a port free on 127.0.0.1 that it never returned before.
func freePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if _, dup := handedOut.LoadOrStore(port, true); !dup {
			return port
		}
	}
	t.Fatal("no free port that was not handed out already")
	return 0
}

// env is one test's deployment: nats-server processes, worker processes, and the test's
// own connection to the bus.
type env struct {
	t        *testing.T
	ctx      context.Context
	dir      string
	natsBin  string
	toolbus  string
	faultbus string
	nodes    []*natsNode
	nc       *nats.Conn
	bus      *events.Bus
	cfg      events.Config

	mu    sync.Mutex
	procs []*proc
}

// newEnv starts n nats-server processes (n = 1, or 3 for a JetStream cluster with R3
// stream and buckets) and opens the bus on them.
func newEnv(t *testing.T, n int) *env {
	t.Helper()
	natsBin, toolbusBin, faultbusBin := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, dir: t.TempDir(), natsBin: natsBin, toolbus: toolbusBin, faultbus: faultbusBin}
	t.Cleanup(e.dumpLogsOnFailure) // runs after every process was killed (TOOLBUS_FAULTS_LOGS=1: always)
	conf := "single.conf"
	if n > 1 {
		conf = "cluster.conf"
	}
	for i := 0; i < n; i++ {
		node := &natsNode{name: "n" + strconv.Itoa(i+1), port: freePort(t), httpPort: freePort(t)}
		if n > 1 {
			node.clusterPort = freePort(t)
		}
		node.store = filepath.Join(e.dir, node.name+"-store")
		node.conf = filepath.Join(deployCopy(t, filepath.Join(e.dir, node.name+"-conf"), node.store), conf)
		e.nodes = append(e.nodes, node)
	}
	for _, node := range e.nodes {
		e.startNode(node)
	}
	for _, node := range e.nodes {
		e.waitNode(node)
	}
	var err error
	e.nc, err = nats.Connect(e.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Name("faults test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	// Executors that die leave the catalog (and their claims become free) after the
	// instance TTL: short here, so recoveries take seconds.
	e.cfg = events.Config{Replicas: 1, InstanceTTL: 2 * time.Second}
	if n > 1 {
		// A cluster's executors hold their leases through a node's loss: the lease must
		// outlast the leader elections of the instances bucket (up to ~15 s measured
		// under the race detector on 2 cores), or the executors, cut off from their
		// renewals, hand their calls back and the calls run again with the same
		// idempotency key, as docs/guarantees.md says a lost lease does.
		e.cfg.Replicas, e.cfg.InstanceTTL = 3, 30*time.Second
	}
	e.eventually("open the bus", 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		e.bus, _, err = provision.Setup(ctx, e.nc, e.cfg)
		return err
	})
	return e
}

// deployCopy copies the config files of deploy/nats to dir with one change: the
// JetStream store directory (/data in the files) is store. (nats-server refuses -sd
// when the file sets store_dir.) It returns dir.
func deployCopy(t testing.TB, dir, store string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "deploy", "nats", "*.conf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no config files in deploy/nats: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b = []byte(strings.ReplaceAll(string(b), "store_dir: /data", "store_dir: "+strconv.Quote(store)))
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func (e *env) startNode(n *natsNode) {
	args := []string{"-c", n.conf, "-n", n.name, "-a", "127.0.0.1", "-p", strconv.Itoa(n.port),
		"-m", strconv.Itoa(n.httpPort)}
	if n.clusterPort != 0 {
		var routes []string
		for _, o := range e.nodes {
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.clusterPort))
		}
		args = append(args, "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", n.clusterPort), "--routes", strings.Join(routes, ","))
	}
	n.proc = startProc(e.t, e.dir, n.name, e.natsBin, args, []string{"NATS_SERVER_NAME=" + n.name})
}

// waitNode waits until the node serves clients and JetStream answers (in a cluster: a
// meta leader is elected).
func (e *env) waitNode(n *natsNode) {
	e.eventually("nats node "+n.name+" ready", 60*time.Second, func() error {
		if n.proc.exited() {
			e.t.Fatalf("nats node %s exited:\n%s", n.name, n.proc.logTail(30))
		}
		nc, err := nats.Connect(n.url(), nats.Timeout(time.Second), nats.NoReconnect())
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	})
}

// restartNode starts a stopped node again on the same port, config and store.
func (e *env) restartNode(n *natsNode) {
	e.startNode(n)
	e.waitNode(n)
}

func (e *env) urls() string {
	var u []string
	for _, n := range e.nodes {
		u = append(u, n.url())
	}
	return strings.Join(u, ",")
}

// worker starts a toolbus role process; extra are more TOOLBUS_* variables.
func (e *env) worker(bin, role, instance string, extra ...string) *proc {
	e.t.Helper()
	vars := []string{
		"TOOLBUS_NATS_URL=" + e.urls(),
		"TOOLBUS_INSTANCE=" + instance,
		"TOOLBUS_REPLICAS=" + strconv.Itoa(e.cfg.Replicas),
		"TOOLBUS_LOG_LEVEL=info",
		"TOOLBUS_GRACE=2s",
		"TOOLBUS_TOOLS=demo,diag", // the suite's calls use diag's sleep and noop
		"TOOLBUS_INSTANCE_TTL=" + e.cfg.InstanceTTL.String(),
	}
	p := startProc(e.t, e.dir, instance, bin, []string{role}, append(vars, extra...))
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p
}

// toolbus starts a role of the real toolbus binary.
func (e *env) toolbusRole(role, instance string, extra ...string) *proc {
	return e.worker(e.toolbus, role, instance, extra...)
}

// faultbusRole starts a role of the faultbus test binary.
func (e *env) faultbusRole(role, instance string, extra ...string) *proc {
	return e.worker(e.faultbus, role, instance, extra...)
}

func (e *env) dumpLogsOnFailure() {
	if !e.t.Failed() && os.Getenv("TOOLBUS_FAULTS_LOGS") == "" {
		return
	}
	var all []*proc
	for _, n := range e.nodes {
		if n.proc != nil {
			all = append(all, n.proc)
		}
	}
	e.mu.Lock()
	all = append(all, e.procs...)
	e.mu.Unlock()
	for _, p := range all {
		e.t.Logf("---- last lines of %s ----\n%s", p.name, p.logTail(25))
	}
}

// checkProcs fails the test when a worker or node died without the test killing it.
func (e *env) checkProcs() {
	e.t.Helper()
	e.mu.Lock()
	procs := append([]*proc(nil), e.procs...)
	e.mu.Unlock()
	for _, n := range e.nodes {
		procs = append(procs, n.proc)
	}
	for _, p := range procs {
		if p != nil && p.unexpectedExit() {
			e.t.Fatalf("%s exited unexpectedly:\n%s", p.name, p.logTail(30))
		}
	}
}

// eventually polls f every 50ms until it returns nil, failing after d. It also fails
// as soon as a process dies unexpectedly.
func (e *env) eventually(what string, d time.Duration, f func() error) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		e.checkProcs()
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not done after %v: %v", what, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReady waits until the catalog has the tools and the consumers of the roles exist
// (each role creates its consumer when it starts serving).
func (e *env) waitReady(tools []string, consumers ...string) {
	e.t.Helper()
	e.eventually("workers ready", 60*time.Second, func() error {
		ctx, cancel := e.op()
		defer cancel()
		kv, err := e.bus.JetStream().KeyValue(ctx, store.BucketTools)
		if err != nil {
			return err
		}
		for _, tool := range tools {
			if _, err := kv.Get(ctx, tool); err != nil {
				return fmt.Errorf("tool %s: %w", tool, err)
			}
		}
		var names []string
		for _, c := range consumers {
			if c != "executor" {
				names = append(names, c)
				continue
			}
			// Executors consume one queue per tool.
			for _, tool := range tools {
				names = append(names, events.ToolConsumer(tool))
			}
		}
		for _, c := range names {
			if _, err := e.consumerInfo(c); err != nil {
				return fmt.Errorf("consumer %s: %w", c, err)
			}
		}
		return nil
	})
}

func runIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return ids
}

// submit starts the runs (concurrently, 8 at a time).
func (e *env) submit(runs []string) { e.submitN(runs, 8) }

// submitN starts the runs, n at a time.
func (e *env) submitN(runs []string, n int) {
	e.t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	ch := make(chan string)
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for run := range ch {
				ctx, cancel := e.op()
				err := e.bus.StartRun(ctx, events.Source("faults", "test"), toolbus.RunStarted{
					RunID: run, Model: "faultbus", Principal: toolbus.Principal{ID: "faults"},
					Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "run " + run}},
				})
				cancel()
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("start %s: %w", run, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, r := range runs {
		ch <- r
	}
	close(ch)
	wg.Wait()
	if first != nil {
		e.t.Fatal(first)
	}
}

// counts returns the number of messages per subject matching filter (nil when the
// server does not answer, e.g. during a restart).
func (e *env) counts(filter string) map[string]uint64 {
	ctx, cancel := e.op()
	defer cancel()
	info, err := e.bus.EventStream().Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil
	}
	if info.State.Subjects == nil {
		return map[string]uint64{}
	}
	return info.State.Subjects
}

// count is the number of messages matching filter, -1 when the server does not answer.
func (e *env) count(filter string) int {
	c := e.counts(filter)
	if c == nil {
		return -1
	}
	n := 0
	for _, v := range c {
		n += int(v)
	}
	return n
}

// waitCompleted waits until every run completed; any other outcome fails the test.
func (e *env) waitCompleted(runs []string, d time.Duration) {
	e.t.Helper()
	want := map[string]bool{}
	for _, r := range runs {
		want[r] = true
	}
	last := time.Now()
	e.eventually("runs completed", d, func() error {
		c := e.counts(events.FilterRunEnded)
		if c == nil {
			return errors.New("server not answering")
		}
		done := 0
		for subj, n := range c {
			run, _ := events.RunIDFromSubject(subj)
			status := subj[strings.LastIndexByte(subj, '.')+1:]
			switch status {
			case "started", "cancel":
				continue
			case string(toolbus.RunCompleted):
				if want[run] {
					done += int(n)
				}
			default:
				e.t.Fatalf("run %s ended %s: %s", run, status, e.lastData(subj))
			}
		}
		if done == len(runs) {
			return nil
		}
		if time.Since(last) > 5*time.Second {
			last = time.Now()
			e.t.Logf("  %d/%d runs completed, %d tool.finished", done, len(runs), e.count(events.FilterToolFinished))
		}
		return fmt.Errorf("%d of %d runs completed", done, len(runs))
	})
}

func (e *env) lastData(subject string) string {
	ctx, cancel := e.op()
	defer cancel()
	m, err := e.bus.EventStream().GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return err.Error()
	}
	return string(m.Data)
}

// op returns the context of one bus operation of the test: bounded, so a request the
// cluster never answers cannot hang the test.
func (e *env) op() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, 10*time.Second)
}

func (e *env) consumerInfo(name string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := e.op()
	defer cancel()
	c, err := e.bus.DurableHome(name).Consumer(ctx, name)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// callKey names one call of a run.
type callKey struct {
	step int
	id   string
}

// runTally is what the stream holds about one run.
type runTally struct {
	started   int
	requested map[int]int                      // model.requested per step
	responded map[int][]toolbus.ModelResponded // model.responded per step
	toolReq   map[callKey]int                  // tool.requested per call
	finished  map[callKey][]toolbus.ToolFinished
	ended     []toolbus.RunEnded
	order     map[int][]int // call indexes of a step in the order their results were stored

	first, last time.Time     // times of the run's first and last events
	maxGap      time.Duration // longest time between two consecutive events of the run
	gapBefore   string        // the event that ended the longest gap
}

// tally reads the whole stream and groups its events by run.
func (e *env) tally() map[string]*runTally {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	evs, err := runlog.Read(ctx, e.bus.EventStream(), events.FilterAll)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]*runTally{}
	var rt *runTally // the run of the event visited
	v := audit.Visitor{
		Undecodable: func(ev runlog.StoredEvent, err error) {
			e.t.Fatalf("undecodable event at seq %d on %s: %v", ev.Seq, ev.Subject, err)
		},
		RunStarted:     func(runlog.StoredEvent, toolbus.RunStarted) { rt.started++ },
		ModelRequested: func(ev runlog.StoredEvent, _ toolbus.ModelRequested) { rt.requested[ev.Meta.Step]++ },
		ModelResponded: func(_ runlog.StoredEvent, mr toolbus.ModelResponded) {
			rt.responded[mr.Step] = append(rt.responded[mr.Step], mr)
		},
		ToolRequested: func(_ runlog.StoredEvent, tr toolbus.ToolRequested) { rt.toolReq[callKey{tr.Step, tr.Call.CallID}]++ },
		ToolFinished: func(_ runlog.StoredEvent, tf toolbus.ToolFinished) {
			k := callKey{tf.Step, tf.ToolResult.CallID}
			rt.finished[k] = append(rt.finished[k], tf)
			rt.order[tf.Step] = append(rt.order[tf.Step], tf.CallIndex)
		},
		RunEnded: func(_ runlog.StoredEvent, re toolbus.RunEnded) { rt.ended = append(rt.ended, re) },
	}
	for _, ev := range evs {
		run, _ := events.RunIDFromSubject(ev.Subject)
		rt = out[run]
		if rt == nil {
			rt = &runTally{requested: map[int]int{}, responded: map[int][]toolbus.ModelResponded{},
				toolReq: map[callKey]int{}, finished: map[callKey][]toolbus.ToolFinished{}, order: map[int][]int{}}
			out[run] = rt
		}
		if rt.first.IsZero() {
			rt.first = ev.Time
		} else if gap := ev.Time.Sub(rt.last); gap > rt.maxGap {
			rt.maxGap, rt.gapBefore = gap, fmt.Sprintf("%s (step %d, call %q)", ev.Meta.Type, ev.Meta.Step, ev.Meta.CallID)
		}
		rt.last = ev.Time
		v.Visit(ev)
	}
	return out
}

// tallyStats sums up a check of the stream.
type tallyStats struct {
	runs, calls   int
	laterAttempt  int // results of a call that ran on a later delivery (attempt > 1)
	reordered     int // steps whose results were stored out of call order
	byExecutor    map[string]int
	modelRequests int
	slowest       string // the slowest run, its duration and its longest wait
	peak          int    // most runs in flight at once (between their first and last events)
}

func (s tallyStats) String() string {
	var ex []string
	for k, v := range s.byExecutor {
		ex = append(ex, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(ex)
	return fmt.Sprintf("%d runs (at most %d in flight at once), %d calls (%d ran on a later delivery, %d steps finished out of call order), model.requested %d, results by executor %v; slowest run %s",
		s.runs, s.peak, s.calls, s.laterAttempt, s.reordered, s.modelRequests, ex, s.slowest)
}

// checkRuns asserts, from the stream, that each run completed once after steps steps of
// calls calls plus an answer: exactly one model.requested and model.responded per step,
// exactly one tool.requested and one tool.finished per call (succeeded, at its call
// index), and, from the step records, the results joined in call order.
func (e *env) checkRuns(tl map[string]*runTally, runs []string, steps, calls int) tallyStats {
	e.t.Helper()
	st := tallyStats{runs: len(runs), byExecutor: map[string]int{}}
	errs := 0
	fail := func(format string, args ...any) {
		errs++
		if errs <= 20 {
			e.t.Errorf(format, args...)
		}
	}
	var slowest time.Duration
	for _, run := range runs {
		rt := tl[run]
		if rt == nil {
			fail("%s: no events", run)
			continue
		}
		if d := rt.last.Sub(rt.first); d > slowest {
			slowest = d
			st.slowest = fmt.Sprintf("%s took %v, longest wait %v before %s", run, d.Round(time.Millisecond),
				rt.maxGap.Round(time.Millisecond), rt.gapBefore)
		}
		if rt.started != 1 {
			fail("%s: %d run.started", run, rt.started)
		}
		if len(rt.ended) != 1 || rt.ended[0].Status != toolbus.RunCompleted || rt.ended[0].StepsUsed != steps+1 {
			fail("%s: outcomes %+v, want one completed after %d steps", run, rt.ended, steps+1)
		}
		for s, n := range rt.requested {
			st.modelRequests += n
			if s < 0 || s > steps || n != 1 {
				fail("%s: %d model.requested for step %d", run, n, s)
			}
		}
		for s := 0; s <= steps; s++ {
			if rt.requested[s] != 1 {
				fail("%s: %d model.requested for step %d, want 1", run, rt.requested[s], s)
			}
			if len(rt.responded[s]) != 1 {
				fail("%s: %d model.responded for step %d, want 1", run, len(rt.responded[s]), s)
			}
		}
		seen := 0
		for s := 0; s < steps; s++ {
			if len(rt.responded[s]) == 0 {
				continue
			}
			cs := rt.responded[s][0].Message.ToolCalls
			if len(cs) != calls {
				fail("%s step %d: %d calls, want %d", run, s, len(cs), calls)
				continue
			}
			for i, c := range cs {
				k := callKey{s, c.CallID}
				if rt.toolReq[k] != 1 {
					fail("%s step %d call %s: %d tool.requested, want 1", run, s, c.CallID, rt.toolReq[k])
				}
				fs := rt.finished[k]
				if len(fs) != 1 {
					fail("%s step %d call %s: %d tool.finished, want exactly 1", run, s, c.CallID, len(fs))
					continue
				}
				seen++
				st.calls++
				f := fs[0]
				if f.CallIndex != i || f.ToolResult.Status != toolbus.StatusSucceeded {
					fail("%s step %d call %s: result at index %d status %s (%s), want index %d succeeded",
						run, s, c.CallID, f.CallIndex, f.ToolResult.Status, f.ToolResult.Content, i)
				}
				if f.ToolResult.Attempt > 1 {
					st.laterAttempt++
				}
				st.byExecutor[f.ToolResult.Executor]++
			}
			for j, idx := range rt.order[s] {
				if idx != j {
					st.reordered++
					break
				}
			}
			ctx, cancel := e.op()
			rec, _, err := e.bus.Store().Step(ctx, run, s)
			cancel()
			if err != nil {
				fail("%s step %d: step record: %v", run, s, err)
				continue
			}
			for i, c := range cs {
				if i >= len(rec.Results) || rec.Results[i] == nil || rec.Results[i].CallID != c.CallID {
					fail("%s step %d: joined result %d is not call %s", run, s, i, c.CallID)
				}
			}
		}
		if n := len(rt.finished); n != seen {
			fail("%s: %d calls have results, %d were asked for", run, n, seen)
		}
	}
	if errs > 20 {
		e.t.Errorf("... and %d more errors", errs-20)
	}
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, run := range runs {
		if rt := tl[run]; rt != nil {
			edges = append(edges, edge{rt.first, 1}, edge{rt.last, -1})
		}
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta > edges[j].delta
		}
		return edges[i].at.Before(edges[j].at)
	})
	cur := 0
	for _, ed := range edges {
		cur += ed.delta
		st.peak = max(st.peak, cur)
	}
	return st
}

// scanLines counts the lines of a file, by their first field.
func scanLines(t testing.TB, path string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return out
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 {
			out[fields[0]] = append(out[fields[0]], sc.Text())
		}
	}
	return out
}

// checkSideEffects asserts that the append tool ran exactly once for every call of the
// runs (steps steps of calls calls, call ids c0, c1, ...) and for nothing else.
func checkSideEffects(t testing.TB, path string, runs []string, steps, calls int) int {
	t.Helper()
	lines := scanLines(t, path)
	want := map[string]bool{}
	for _, run := range runs {
		for s := 0; s < steps; s++ {
			for i := 0; i < calls; i++ {
				want[fmt.Sprintf("%s/%d/c%d", run, s, i)] = true
			}
		}
	}
	bad := 0
	for key := range want {
		if n := len(lines[key]); n != 1 {
			bad++
			if bad <= 10 {
				t.Errorf("side effect of %s ran %d times: %q", key, n, lines[key])
			}
		}
	}
	for key, ls := range lines {
		if !want[key] {
			t.Errorf("unexpected side effect %s: %q", key, ls)
		}
	}
	return len(lines)
}

// waitClaimed waits until instance holds the claim of each of the run's step-0 calls c0
// .. c<calls-1> (delivered, claimed, not finished). check, when given, runs first on
// each poll (a condition the wait also needs, or a t.Fatal on what must not happen).
func (e *env) waitClaimed(run, instance string, calls int, check func() error) {
	e.t.Helper()
	claims, err := e.bus.JetStream().KeyValue(e.ctx, store.BucketClaims)
	if err != nil {
		e.t.Fatal(err)
	}
	e.eventually(fmt.Sprintf("%d calls claimed by %s", calls, instance), 30*time.Second, func() error {
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		for i := range calls {
			ctx, cancel := e.op()
			entry, err := claims.Get(ctx, store.ClaimKey("append", run, 0, fmt.Sprintf("c%d", i)))
			cancel()
			if err != nil {
				return fmt.Errorf("call c%d not claimed yet: %w", i, err)
			}
			if !strings.Contains(string(entry.Value()), `"`+instance+`"`) {
				return fmt.Errorf("call c%d claimed by %s", i, entry.Value())
			}
		}
		return nil
	})
}

// noResults is a waitClaimed check: a result before the fault fails the test (the
// calls finished too early for the fault to hit them).
func (e *env) noResults() error {
	if n := e.count(events.FilterToolFinished); n > 0 {
		e.t.Fatalf("%d results before the fault", n)
	}
	return nil
}

// checkTakenOver asserts that the append tool ran exactly once for every call of the
// runs (checkSideEffects), each time on instance at attempt 2: the executor that took
// the calls over from one that was killed, paused or cut off.
func checkTakenOver(t testing.TB, path string, runs []string, steps, calls int, instance string) {
	t.Helper()
	checkSideEffects(t, path, runs, steps, calls)
	for key, lines := range scanLines(t, path) {
		if f := strings.Fields(lines[0]); len(f) < 3 || f[1] != instance || f[2] != "2" {
			t.Errorf("side effect of %s: %q, want %s at attempt 2", key, lines, instance)
		}
	}
}

// accounts is a deployment in the accounts layout (operator/JWT) generated in genDir,
// by `toolbus admin` (a.admin) or by deploy/nats/gen: one node on the generated
// auth-jwt.conf (newAccounts), or three in a cluster (newClusterAccounts). The test
// generates it, then a.up starts it.
type accounts struct {
	*env
	genDir string
}

// newAccounts is a one-node accounts deployment, its store in the test's directory.
// The node has the generated config's server name: a reload refuses a name other than
// the running one, and the harness names its nodes on the command line.
func newAccounts(t *testing.T) *accounts {
	t.Helper()
	a := newAccountsEnv(t, events.Config{Replicas: 1, InstanceTTL: 2 * time.Second})
	a.nodes = []*natsNode{{name: "toolbus-nats-1", port: freePort(t), httpPort: freePort(t),
		store: filepath.Join(a.dir, "store"), conf: filepath.Join(a.genDir, "auth-jwt.conf")}}
	return a
}

// newAccountsEnv is the env of an accounts deployment, with no node yet.
func newAccountsEnv(t *testing.T, cfg events.Config) *accounts {
	t.Helper()
	natsBin, toolbusBin, faultbusBin := binaries(t)
	e := &env{t: t, ctx: t.Context(), dir: t.TempDir(), natsBin: natsBin, toolbus: toolbusBin, faultbus: faultbusBin, cfg: cfg}
	t.Cleanup(e.dumpLogsOnFailure)
	return &accounts{env: e, genDir: filepath.Join(e.dir, "nats")}
}

// creds is the credentials file of user.
func (a *accounts) creds(user string) string { return filepath.Join(a.genDir, user+".creds") }

// admin runs `toolbus admin <args> -dir genDir`, as the docs do (it connects, where it
// does, with genDir's admin.creds).
func (a *accounts) admin(args ...string) string {
	a.t.Helper()
	cmd := exec.CommandContext(a.ctx, a.toolbus, append(append([]string{"admin"}, args...), "-dir", a.genDir)...)
	cmd.Env = append(os.Environ(), "TOOLBUS_NATS_URL="+a.urls())
	out, err := cmd.CombinedOutput()
	if err != nil {
		a.t.Fatalf("toolbus admin %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// up starts the nodes on their configs, connects the test as admin, creates the queues
// of tools (a.initTools) and opens the bus.
func (a *accounts) up(tools string) {
	a.t.Helper()
	for _, n := range a.nodes {
		a.startNode(n)
	}
	for _, n := range a.nodes {
		waitNodeAs(a.env, n, a.creds("admin"))
	}
	var err error
	if a.nc, err = nats.Connect(a.urls(), nats.UserCredentials(a.creds("admin")), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(a.nc.Close)
	a.initTools(tools)
	if a.bus, err = events.Open(a.ctx, a.nc, a.cfg); err != nil {
		a.t.Fatal(err)
	}
}

// initTools runs `toolbus init --tools tools` as admin.
func (a *accounts) initTools(tools string) {
	a.t.Helper()
	a.cli("init-"+tools, 0, "init", "--tools", tools)
}

// cli runs `toolbus <args>` as admin (its log named name), waits for it to end with exit
// code want and returns its output.
func (a *accounts) cli(name string, want int, args ...string) string {
	a.t.Helper()
	p := startProc(a.t, a.dir, name, a.toolbus, args,
		[]string{"TOOLBUS_NATS_URL=" + a.urls(), "TOOLBUS_NATS_CREDS=" + a.creds("admin"),
			"TOOLBUS_REPLICAS=" + strconv.Itoa(a.cfg.Replicas), "TOOLBUS_INSTANCE_TTL=" + a.cfg.InstanceTTL.String()})
	p.expect()
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		a.t.Fatalf("toolbus %s did not end:\n%s", strings.Join(args, " "), p.logTail(20))
	}
	if code := p.cmd.ProcessState.ExitCode(); code != want {
		a.t.Fatalf("toolbus %s exited %d, want %d:\n%s", strings.Join(args, " "), code, want, p.logTail(20))
	}
	return p.logText()
}

// waitNodeAs waits until node n serves user's credentials with JetStream (a meta leader
// elected).
func waitNodeAs(e *env, n *natsNode, creds string) {
	e.t.Helper()
	e.eventually("nats node "+n.name+" ready", 2*time.Minute, func() error {
		if n.proc.exited() {
			e.t.Fatalf("nats node %s exited:\n%s", n.name, n.proc.logTail(30))
		}
		nc, err := nats.Connect(n.url(), nats.UserCredentials(creds), nats.Timeout(time.Second), nats.NoReconnect())
		if err != nil {
			return err
		}
		defer nc.Close()
		_, err = nc.Request("$JS.API.INFO", nil, 2*time.Second)
		return err
	})
}

// adminJetStream connects to url with creds (the admin's, in the security tests'
// checks) and returns a context for reading and the JetStream API; both end with t.
func adminJetStream(t *testing.T, url, creds string) (context.Context, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx, js
}
