package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/accounts"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/internal/testutil"
)

// queueUpgradeFixture is a deployment the last version before the queue stream (commit
// e1669cb) made with toolbus admin init and add-team alpha calc (its README says how):
// the accounts layout with a full resolver whose directory is queueUpgradeResolver.
const (
	queueUpgradeFixture  = "testdata/upgrade-e1669cb"
	queueUpgradeResolver = "/tmp/upgrade-e1669cb/tb/resolver"
)

// TestUpgradeToQueueStream runs docs/deployment-and-security.md's "Upgrading to the
// queue stream" as written on a copy of queueUpgradeFixture, served as the previous
// version left it: an in-process server on its auth-jwt.conf (the resolver's directory
// moved into the test's), the store as that version's toolbus init --tools calc made it
// (the event stream, and calc's queue the durable tool_calc on it), the injector's write
// service on its injector.creds. The planner (its planner.creds as they were) publishes
// a call of calc, which alpha's executor of the earlier version pulls through its
// account's old imports and has not acknowledged: toolbus init then fails with
// provision.ErrQueuesNotDrained and the note's error text, and changes nothing (no queue
// stream; tool_calc still on the event stream, with its call). The executor acknowledges
// it, and the note's lines run: toolbus tools (ToolQueueInfo, what it prints under
// PENDING and IN FLIGHT) until calc's queue is empty, toolbus init (provision.Setup with
// the options cmd/toolbus's init gives), the new permissions copied, toolbus admin push
// (the CLI's Main), alpha's executor of the new version (a worker in its account on
// executor-alpha.creds as they were, serving a calc that counts its executions) and the
// planner on the new planner.creds. After: tool_calc of the event stream is gone, the
// core executor's new executor.creds reach calc's queue on the queue stream where the old
// ones do not, a call published after the upgrade runs exactly once, and the drained
// call is never queued again (the queue stream holds one call, calc ran the drained
// run's call no time).
func TestUpgradeToQueueStream(t *testing.T) {
	doc := filepath.Join("..", "..", "..", "..", "docs", "deployment-and-security.md")
	lines := docBlock(t, doc, "upgrade-queue-stream")
	refusal := strings.TrimSpace(docFence(t, doc, "upgrade-queue-stream", "text"))
	ctx := eventstest.Context(t, 2*time.Minute)
	l := newLiveAdmin(t, ctx)
	copyTree(t, queueUpgradeFixture, l.dir)
	for _, f := range []string{"auth-jwt.conf", SettingsFile} {
		p := filepath.Join(l.dir, f)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), queueUpgradeResolver) {
			t.Fatalf("%s does not name the resolver's directory %s", f, queueUpgradeResolver)
		}
		b = []byte(strings.ReplaceAll(string(b), queueUpgradeResolver, filepath.Join(l.dir, "resolver")))
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts, err := server.ProcessConfigFile(filepath.Join(l.dir, "auth-jwt.conf"))
	if err != nil {
		t.Fatal(err)
	}
	l.srv = eventstest.StartServer(t, opts)
	admin := l.must("admin.creds")
	adminJS, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	queues, calc := events.QueueStreamName(events.DefaultStream), events.ToolConsumer("calc")
	storeOfE1669cb(t, ctx, admin)
	intaketest.ServeIntake(t, l.must("injector.creds"), intake.Limits{})
	adminBus, err := events.Open(ctx, admin, events.Config{})
	if err != nil {
		t.Fatal(err)
	}

	// Before: the planner's call, taken by alpha's executor of e1669cb and running.
	publishCall(t, ctx, l.must("planner.creds"), "r1")
	oldJS, err := jetstream.NewWithAPIPrefix(l.must("executor-alpha.creds"), accounts.CoreAPIPrefix)
	if err != nil {
		t.Fatal(err)
	}
	oldQueue, err := oldJS.Consumer(ctx, events.DefaultStream, calc)
	if err != nil {
		t.Fatalf("alpha's executor of e1669cb binds calc's queue on %s: %v", events.DefaultStream, err)
	}
	taken, err := oldQueue.Next(jetstream.FetchMaxWait(20 * time.Second))
	if err != nil || taken.Subject() != events.SubjectToolRequested("r1", "calc") {
		t.Fatalf("alpha's executor of e1669cb took %v, %v: want r1's call", taken, err)
	}
	if q := queueShown(t, ctx, adminBus, "calc"); q.Pending != 0 || q.InFlight != 1 {
		t.Errorf("toolbus tools shows calc's queue %d pending, %d in flight; want the call running", q.Pending, q.InFlight)
	}

	// toolbus init refuses, and changes nothing.
	err = initAsNoteSays(ctx, admin, "TOOLBUS_NATS_CREDS=tb/admin.creds toolbus init --tools calc")
	if !errors.Is(err, provision.ErrQueuesNotDrained) {
		t.Fatalf("toolbus init with a call of calc running: %v, want ErrQueuesNotDrained", err)
	}
	if got := "toolbus: init: " + err.Error(); got != refusal {
		t.Errorf("toolbus init says\n%s\nthe note says\n%s", got, refusal)
	}
	if _, err := adminJS.Stream(ctx, queues); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the refused init left %s: %v", queues, err)
	}
	if c, err := adminJS.Consumer(ctx, events.DefaultStream, calc); err != nil || c.CachedInfo().NumAckPending != 1 {
		t.Fatalf("the refused init left calc's queue on %s: %v, want it with its call running", events.DefaultStream, err)
	}

	// The executor of e1669cb finishes the call; then the note, line by line.
	if err := taken.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ran := map[string]int{} // calc's executions by run
	planner := runQueueNote(t, l, adminBus, lines, func(run string) {
		mu.Lock()
		defer mu.Unlock()
		ran[run]++
	})

	if _, err := adminJS.Consumer(ctx, events.DefaultStream, calc); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("calc's queue on %s after the upgrade: %v, want it deleted", events.DefaultStream, err)
	}
	// The core's executor: the push revoked its JWT of e1669cb (which may pull the queues
	// on the event stream, the new one may not); the one it issued reaches the queue.
	oldCreds, err := filepath.Abs(filepath.Join(queueUpgradeFixture, "executor.creds"))
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := l.connect(oldCreds); err == nil {
		nc.Close()
		t.Error("the core's executor connects with its executor.creds of e1669cb after the push")
	}
	if js, err := jetstream.New(l.must("executor.creds")); err != nil {
		t.Fatal(err)
	} else if _, err := js.Consumer(ctx, queues, calc); err != nil {
		t.Errorf("the core's executor with the new executor.creds binds calc's queue on %s: %v", queues, err)
	}

	// After: a new call runs once; the drained one never again.
	publishCall(t, ctx, planner, "r2")
	eventstest.Eventually(t, time.Minute, func() error {
		s, err := adminJS.Stream(ctx, events.DefaultStream)
		if err != nil {
			return err
		}
		_, err = s.GetLastMsgForSubject(ctx, events.SubjectToolFinished("r2", "calc"))
		return err
	})
	eventstest.Eventually(t, 30*time.Second, func() error {
		c, err := adminJS.Consumer(ctx, queues, calc)
		if err != nil {
			return err
		}
		if ci := c.CachedInfo(); ci.NumPending != 0 || ci.NumAckPending != 0 || ci.Delivered.Stream != 1 {
			return fmt.Errorf("calc's queue: %d pending, %d running, delivered up to %d, want r2's call alone and done", ci.NumPending, ci.NumAckPending, ci.Delivered.Stream)
		}
		return nil
	})
	s, err := adminJS.Stream(ctx, queues)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%s holds %d calls, want r2's alone (r1's was published before it)", queues, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if ran["r1"] != 0 || ran["r2"] != 1 {
		t.Errorf("calc ran r1's drained call %d times and r2's %d, want 0 and 1", ran["r1"], ran["r2"])
	}
}

// storeOfE1669cb sets the core up as toolbus init --tools calc of e1669cb did: what
// init makes now but the queue stream, and calc's queue the durable of the event stream
// that version made (events.FilterToolRequestedFor, the rest as the queue's now:
// DeliverNew, AckExplicit, MaxDeliver -1).
func storeOfE1669cb(t *testing.T, ctx context.Context, admin *nats.Conn) {
	t.Helper()
	if _, _, err := provision.Setup(ctx, admin, events.Config{}, provision.WithTools([]string{"calc"}, 0, 0), provision.WithReadMirror()); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	queues := events.QueueStreamName(events.DefaultStream)
	c, err := js.Consumer(ctx, queues, events.ToolConsumer("calc"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	if err := js.DeleteStream(ctx, queues); err != nil {
		t.Fatal(err)
	}
	cfg.FilterSubject, cfg.FilterSubjects = events.FilterToolRequestedFor("calc"), nil
	if cfg.DeliverPolicy != jetstream.DeliverNewPolicy || cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.MaxDeliver != -1 {
		t.Fatalf("a tool's queue is now %+v: not the queue of e1669cb", cfg)
	}
	if _, err := js.CreateConsumer(ctx, events.DefaultStream, cfg); err != nil {
		t.Fatal(err)
	}
}

// publishCall publishes, as the planner on nc, a call of calc in run whose arguments
// name the run.
func publishCall(t *testing.T, ctx context.Context, nc *nats.Conn, run string) {
	t.Helper()
	bus, err := events.Open(ctx, nc, events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tr := toolbus.ToolRequested{RunID: run, CallCount: 1, Principal: toolbus.Principal{ID: "alice"},
		Deadline: time.Now().Add(time.Hour), Call: toolbus.ToolCall{CallID: "c1", Tool: "calc", Arguments: `{"run":"` + run + `"}`}}
	if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("planner", tr, true)); err != nil {
		t.Fatalf("the planner publishes %s's call: %v", run, err)
	}
}

// queueShown is what toolbus tools shows of tool's queue (its PENDING and IN FLIGHT).
func queueShown(t *testing.T, ctx context.Context, bus *events.Bus, tool string) events.ToolQueue {
	t.Helper()
	q, err := bus.ToolQueueInfo(ctx, tool)
	if err != nil {
		t.Fatalf("toolbus tools: %v", err)
	}
	return q
}

// initAsNoteSays runs a toolbus init line of the note with admin: provision.Setup with
// the options cmd/toolbus's init gives it (the --tools, the read mirror).
func initAsNoteSays(ctx context.Context, admin *nats.Conn, line string) error {
	_, tools, ok := strings.Cut(line, " toolbus init --tools ")
	if !ok || !strings.HasPrefix(line, "TOOLBUS_NATS_CREDS=tb/admin.creds ") {
		return fmt.Errorf("not the note's init: %s", line)
	}
	_, _, err := provision.Setup(ctx, admin, events.Config{},
		provision.WithTools(strings.Split(tools, ","), 0, 0), provision.WithReadMirror())
	return err
}

// runQueueNote runs the lines of the note on l's deployment: toolbus tools until every
// queue of the grants is empty, toolbus init, the copy of the permissions, toolbus admin
// through Main, alpha's executor as a worker in its account whose calc calls ran with
// the run its arguments name, and the planner, whose connection it returns. A line it
// does not know fails the test.
func runQueueNote(t *testing.T, l *liveAdmin, adminBus *events.Bus, lines []string, ran func(run string)) *nats.Conn {
	t.Helper()
	var planner *nats.Conn
	url, n := "", 0
	for _, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n++
		switch {
		case strings.HasPrefix(line, "export TOOLBUS_NATS_URL="):
			url = l.srv.ClientURL()
		case line == "TOOLBUS_NATS_CREDS=tb/admin.creds toolbus tools":
			eventstest.Eventually(t, 30*time.Second, func() error {
				if q := queueShown(t, l.ctx, adminBus, "calc"); q.Pending != 0 || q.InFlight != 0 {
					return fmt.Errorf("toolbus tools: calc %d pending, %d in flight", q.Pending, q.InFlight)
				}
				return nil
			})
		case strings.Contains(line, " toolbus init "):
			if err := initAsNoteSays(l.ctx, l.must("admin.creds"), line); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
		case strings.HasPrefix(line, "cp ") && strings.HasSuffix(line, " tb/permissions/"):
			for _, f := range strings.Fields(line)[1 : len(strings.Fields(line))-1] {
				b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(l.dir, PermsDir, filepath.Base(f)), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		case strings.HasPrefix(line, "toolbus admin "):
			out := l.adm(url, withoutDir(t, strings.Fields(strings.TrimPrefix(line, "toolbus admin ")))...)
			for _, want := range []string{"changed   account TOOLBUS: pushed", "changed   account of team alpha: pushed",
				"hand to the holders of executor:", "hand to the holders of planner:"} {
				if !strings.Contains(out, want) {
					t.Errorf("%s does not say %q:\n%s", line, want, out)
				}
			}
			if !sameFile(t, filepath.Join(queueUpgradeFixture, "executor-alpha.creds"), filepath.Join(l.dir, "executor-alpha.creds")) {
				t.Errorf("%s changed executor-alpha.creds: the note says a team's credential files do not change", line)
			}
		case strings.HasSuffix(line, " toolbus executor"):
			startNoteExecutor(t, l, line, ran)
		case line == "TOOLBUS_NATS_CREDS=tb/planner.creds toolbus planner":
			planner = l.must("planner.creds")
		default:
			t.Fatalf("a line of the note this test does not run: %s", line)
		}
	}
	if n != 7 || planner == nil {
		t.Fatalf("ran %d lines of the note (planner %v): want export, tools, init, cp, push, executor, planner", n, planner != nil)
	}
	return planner
}

// startNoteExecutor runs the executor of line: a worker on the line's credentials,
// team, tools and API prefix, serving calc, which reports each execution to ran.
func startNoteExecutor(t *testing.T, l *liveAdmin, line string, ran func(run string)) {
	t.Helper()
	env := map[string]string{}
	for _, f := range strings.Fields(strings.TrimSuffix(line, " toolbus executor")) {
		k, v, _ := strings.Cut(f, "=")
		env[k] = v
	}
	creds, ok := strings.CutPrefix(env["TOOLBUS_NATS_CREDS"], "tb/")
	if !ok || env["TOOLBUS_EXECUTOR_TOOLS"] != "calc" {
		t.Fatalf("an executor this test does not run: %s", line)
	}
	bus, err := events.Open(l.ctx, l.must(creds), events.Config{APIPrefix: env["TOOLBUS_NATS_API_PREFIX"]})
	if err != nil {
		t.Fatal(err)
	}
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "calc", Description: "counts its runs", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(_ context.Context, args json.RawMessage) (any, error) {
			var a struct{ Run string }
			_ = json.Unmarshal(args, &a)
			ran(a.Run)
			return "ok", nil
		}}); err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(bus, testutil.Must(executor.New(reg)), worker.Config{Team: env["TOOLBUS_TEAM"], Tools: []string{"calc"},
		WorkerConfig: workerconfig.WorkerConfig{Instance: "alpha-new", Logger: testutil.Logger()}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(l.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("alpha's executor: %v", err)
		}
	})
}
