package injector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// TestEndedRunsFreeTheirTimers: many runs with far deadlines (a year, which the cap
// brings down to a day) end at once (cancelled); their deadline timers are freed as they
// end, not at their deadlines, so with MaxTimers 5 a victim run started afterwards still
// ends by its own 2 s deadline, and once it ended the injector holds no timer and no
// per-run state for any of them: the timer consumer has nothing pending, and the step,
// call and result caches are empty.
func TestEndedRunsFreeTheirTimers(t *testing.T) {
	n := 200
	if os.Getenv("TOOLBUS_FAULTS") == "1" {
		n = 2000
	}
	ctx := eventstest.Context(t, 5*time.Minute)
	bus := eventstest.Setup(t, events.Config{Memory: true})
	in, err := New(bus, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "timers", Concurrency: 16,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, MaxTimers: 5, DeadlineGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runInjector(t, ctx, in)
	start := func(run string, deadline time.Time) { t.Helper(); startRun(t, ctx, bus, run, deadline) }
	status := func(run string) toolbus.RunStatus {
		st, _, err := bus.Store().RunState(ctx, run)
		if err != nil {
			return ""
		}
		return st.Status
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			run := fmt.Sprintf("short-%04d", i)
			start(run, time.Now().AddDate(1, 0, 0))
			eventstest.Eventually(t, time.Minute, func() error {
				if status(run) == "" {
					return fmt.Errorf("run %s not recorded", run)
				}
				return nil
			})
			if _, err := bus.PublishCancel(ctx, events.Source("test", "t"), toolbus.Cancel{RunID: run, Reason: "short"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	eventstest.Eventually(t, 2*time.Minute, func() error {
		for i := 0; i < n; i++ {
			if run := fmt.Sprintf("short-%04d", i); status(run) != toolbus.RunCancelled {
				return fmt.Errorf("run %s: %q", run, status(run))
			}
		}
		return nil
	})
	victim := "victim"
	start(victim, time.Now().Add(2*time.Second))
	// Without freeing, the victim's timer would wait for a slot until the short runs'
	// deadlines (a day): generous bounds, still far below that.
	eventstest.Eventually(t, time.Minute, func() error {
		st, _, err := bus.Store().RunState(ctx, victim)
		if err != nil {
			return err
		}
		if st.Status != toolbus.RunLimitReached || st.Code != toolbus.LimitDeadline {
			return fmt.Errorf("victim %s/%s", st.Status, st.Code)
		}
		return nil
	})
	eventstest.Eventually(t, time.Minute, func() error {
		cons, err := bus.EventStream().Consumer(ctx, "injector-timers")
		if err != nil {
			return err
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if ci.NumAckPending != 0 || ci.NumPending != 0 {
			return fmt.Errorf("timer consumer: %d held, %d waiting", ci.NumAckPending, ci.NumPending)
		}
		if h := in.timers.len(); h != 0 {
			return fmt.Errorf("%d timers held in memory", h)
		}
		return nil
	})
	in.steps.mu.Lock()
	steps := len(in.steps.m)
	in.steps.mu.Unlock()
	calls := in.calls.len()
	in.results.mu.Lock()
	results := len(in.results.m)
	in.results.mu.Unlock()
	if steps+calls+results != 0 {
		t.Errorf("ended runs still hold per-run state: %d step queues, %d cached call lists, %d result sets", steps, calls, results)
	}
}

// TestTimerHeldWithoutReadingTheRunState: a run's deadline timer, first delivered while
// the outcome events answer for the run (it started after the injector followed them),
// is held until its deadline without a read of the run state; the run's end, heard
// from its outcome event, still frees it.
func TestTimerHeldWithoutReadingTheRunState(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	bus := eventstest.Setup(t, events.Config{Memory: true})
	in, err := New(bus, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "held", AckWait: 4 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	reads := eventstest.Counter(t, bus.Conn(), "$JS.API.DIRECT.GET.KV_"+store.BucketRuns+".>")
	runInjector(t, ctx, in)
	eventstest.Eventually(t, time.Minute, func() error {
		if _, ok := in.ends.Lookup("later", math.MaxUint64); !ok {
			return errors.New("the outcome events do not answer yet")
		}
		return nil
	})
	const run = "held-timer"
	startRun(t, ctx, bus, run, time.Now().Add(time.Hour))
	timersHeld := func(want int) func() error {
		return func() error {
			cons, err := bus.EventStream().Consumer(ctx, "injector-timers")
			if err != nil {
				return err
			}
			ci, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			if ci.NumAckPending != want || in.timers.len() != want {
				return fmt.Errorf("timers held: %d by the server, %d in memory; want %d", ci.NumAckPending, in.timers.len(), want)
			}
			return nil
		}
	}
	eventstest.Eventually(t, time.Minute, timersHeld(1))
	if n := reads(); n != 0 {
		t.Errorf("the run state was read %d times before the timer was held, want 0", n)
	}
	if _, err := bus.PublishCancel(ctx, events.Source("test", "t"), toolbus.Cancel{RunID: run, Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, time.Minute, timersHeld(0))
}

// TestTimerHeldQuietly: a deadline timer not due before the timer consumer's
// acknowledgement wait is kept without a word to the server for half of that wait
// (timerHold): a run that ends meanwhile costs its timer one acknowledgement and no
// hand-back; a run still going is handed back with a delay before the server would
// redeliver.
func TestTimerHeldQuietly(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	bus := eventstest.Setup(t, events.Config{Memory: true})
	const ackWait = 6 * time.Second
	in, err := New(bus, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "quiet", AckWait: ackWait,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, DeadlineGrace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		acks []string
	)
	sub, err := bus.Conn().Subscribe("$JS.ACK."+bus.Config().Stream+".injector-timers.>", func(m *nats.Msg) {
		mu.Lock()
		acks = append(acks, strings.Fields(string(m.Data))[0])
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	seen := func() []string {
		_ = bus.Conn().Flush()
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), acks...)
	}
	runInjector(t, ctx, in)
	start := func(run string, deadline time.Time) {
		t.Helper()
		startRun(t, ctx, bus, run, deadline)
		eventstest.Eventually(t, time.Minute, func() error {
			in.timers.mu.Lock()
			defer in.timers.mu.Unlock()
			if in.timers.m[run] == nil {
				return fmt.Errorf("timer of %s not held", run)
			}
			return nil
		})
	}
	timerInfo := func() *jetstream.ConsumerInfo {
		t.Helper()
		cons, err := bus.EventStream().Consumer(ctx, "injector-timers")
		if err != nil {
			t.Fatal(err)
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ci
	}

	// A run that ends within the hold: one acknowledgement, nothing else.
	start("short", time.Now().Add(time.Hour))
	if a := seen(); len(a) != 0 {
		t.Fatalf("a timer held quietly answered the server: %v", a)
	}
	if _, err := bus.PublishCancel(ctx, events.Source("test", "t"), toolbus.Cancel{RunID: "short", Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		if ci := timerInfo(); ci.NumAckPending != 0 {
			return fmt.Errorf("%d timers held by the server", ci.NumAckPending)
		}
		return nil
	})
	if a := seen(); len(a) != 1 || a[0] != "+ACK" {
		t.Fatalf("the short run's timer: %v, want one +ACK", a)
	}

	// A run still going when the hold ends: handed back before the acknowledgement wait.
	start("long", time.Now().Add(time.Hour))
	eventstest.Eventually(t, time.Minute, func() error {
		if a := seen(); len(a) != 2 || a[1] != "-NAK" {
			return fmt.Errorf("acknowledgements %v, want the long run's -NAK", a)
		}
		return nil
	})
	// Had the hold outlasted the acknowledgement wait, the server would have redelivered
	// the timer before the hand-back.
	if ci := timerInfo(); ci.NumRedelivered != 0 || ci.NumAckPending != 1 {
		t.Errorf("timer consumer: %d redelivered, %d held; want 0 and 1", ci.NumRedelivered, ci.NumAckPending)
	}
}

// TestTimerHoldBounds: a timer is held quietly only when it is not due before the timer
// consumer's acknowledgement wait, and for half of it: a redelivery after a crash of the
// injector that holds it still comes before the deadline.
func TestTimerHoldBounds(t *testing.T) {
	for _, tc := range []struct {
		ackWait, wait, want time.Duration
	}{
		{0, time.Hour, 0},                       // the wait is not known yet
		{30 * time.Second, 10 * time.Second, 0}, // due within the wait: handed back at once
		{30 * time.Second, 30 * time.Second, 15 * time.Second},
		{30 * time.Second, time.Hour, 15 * time.Second},
	} {
		in, err := New(nil, Config{})
		if err != nil {
			t.Fatal(err)
		}
		in.timerAckWait.Store(int64(tc.ackWait))
		if got := in.timerHold(tc.wait); got != tc.want {
			t.Errorf("ack wait %v, due in %v: hold %v, want %v", tc.ackWait, tc.wait, got, tc.want)
		}
	}
}

// startRun starts run with deadline on bus.
func startRun(t *testing.T, ctx context.Context, bus *events.Bus, run string, deadline time.Time) {
	t.Helper()
	if err := bus.StartRun(ctx, events.Source("test", "t"), toolbus.RunStarted{RunID: run, Model: "m",
		Principal: toolbus.Principal{ID: "p"}, Limits: toolbus.Limits{Deadline: deadline},
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "x"}}}); err != nil {
		t.Fatal(err)
	}
}

// runInjector runs in until the test ends (or stop is called).
func runInjector(t *testing.T, ctx context.Context, in *Injector) (stop func()) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// kept waits until in keeps the run.started of run (armTimer).
func kept(t *testing.T, in *Injector, run string) {
	t.Helper()
	eventstest.Eventually(t, time.Minute, func() error {
		in.starts.mu.Lock()
		defer in.starts.mu.Unlock()
		if in.starts.m[run] == nil {
			return fmt.Errorf("the run.started of %s is not kept", run)
		}
		return nil
	})
}

// TestYoungRunsNeedNoTimer: the first run.started of a run whose deadline is further
// than the started consumer's acknowledgement wait is kept instead of publishing the
// run's deadline timer at once: a run that ends while it is kept never gets a timer
// (its end acknowledges the run.started); one still going when the hold is over gets its
// timer, and its run.started is acknowledged then.
func TestYoungRunsNeedNoTimer(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	bus := eventstest.Setup(t, events.Config{Memory: true})
	in, err := New(bus, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "young", AckWait: 4 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	timers := eventstest.Counter(t, bus.Conn(), events.FilterTimers)
	runInjector(t, ctx, in)
	startedPending := func() int {
		cons, err := bus.EventStream().Consumer(ctx, "injector-started")
		if err != nil {
			t.Fatal(err)
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ci.NumAckPending
	}

	startRun(t, ctx, bus, "young", time.Now().Add(time.Hour))
	kept(t, in, "young")
	if _, err := bus.PublishCancel(ctx, events.Source("test", "t"), toolbus.Cancel{RunID: "young", Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, time.Minute, func() error {
		if n := startedPending(); n != 0 || in.starts.len() != 0 {
			return fmt.Errorf("run.started kept: %d by the server, %d in memory", n, in.starts.len())
		}
		return nil
	})
	if n := timers(); n != 0 {
		t.Fatalf("%d deadline timer(s) published for a run that ended young, want 0", n)
	}

	startRun(t, ctx, bus, "grown", time.Now().Add(time.Hour))
	kept(t, in, "grown")
	eventstest.Eventually(t, time.Minute, func() error {
		if n := timers(); n != 1 {
			return fmt.Errorf("%d deadline timers published, want the grown run's", n)
		}
		if n := startedPending(); n != 0 || in.starts.len() != 0 {
			return fmt.Errorf("run.started kept: %d by the server, %d in memory", n, in.starts.len())
		}
		return nil
	})
}

// TestKeptStartOutlivesItsKeeper: the injector that keeps a run's run.started dies
// (its connection is gone) before the hold is over, and the run goes on past its start
// meanwhile: the server redelivers the run.started to another injector, which arms the
// deadline timer, and the run still ends by its deadline.
func TestKeptStartOutlivesItsKeeper(t *testing.T) {
	ctx := eventstest.Context(t, 2*time.Minute)
	srv := eventstest.RunJetStream(t)
	cfg := events.Config{Memory: true}
	bus, _, err := provision.Setup(ctx, srv.Conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ncA, _ := srv.Connect(t)
	busA, err := events.Open(ctx, ncA, cfg)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const ackWait = 4 * time.Second
	a, err := New(busA, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "keeper", AckWait: ackWait, Logger: quiet},
		DeadlineGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopA := runInjector(t, ctx, a)
	const run = "orphan"
	deadline := time.Now().Add(ackWait + 2*time.Second)
	startRun(t, ctx, bus, run, deadline)
	kept(t, a, run)
	ncA.Close() // dies: neither the timer nor an answer for the run.started comes from it
	stopA()
	// The run goes past its start meanwhile (the model answered step 0).
	if _, _, err := bus.Store().PutAssistant(ctx, toolbus.ModelResponded{RunID: run, Step: 0,
		Message: toolbus.Message{Role: toolbus.RoleAssistant, ToolCalls: []toolbus.ToolCall{{CallID: "c1", Tool: "slow"}}}}); err != nil {
		t.Fatal(err)
	}
	b, err := New(bus, Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "heir", AckWait: ackWait, Logger: quiet},
		DeadlineGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runInjector(t, ctx, b)
	eventstest.Eventually(t, time.Minute, func() error {
		st, _, err := bus.Store().RunState(ctx, run)
		if err != nil {
			return err
		}
		if st.Status != toolbus.RunLimitReached || st.Code != toolbus.LimitDeadline {
			return fmt.Errorf("run %s/%s, want limit_reached/deadline", st.Status, st.Code)
		}
		return nil
	})
}

// TestStartHoldBounds: a run.started is kept only when the deadline is not within the
// started consumer's acknowledgement wait, the consumer's MaxAckPending was raised for it
// (a consumer set up before, at 64, keeps nothing: runs would queue behind kept
// deliveries), and this injector keeps less than an eighth of that limit.
func TestStartHoldBounds(t *testing.T) {
	for _, tc := range []struct {
		name              string
		ackWait, wait     time.Duration
		maxPending, keeps int
		want              time.Duration
	}{
		{"not known yet", 0, time.Hour, 0, 0, 0},
		{"old consumer", 30 * time.Second, time.Hour, 64, 0, 0},
		{"deadline within the wait", 30 * time.Second, 20 * time.Second, 100000, 0, 0},
		{"kept", 30 * time.Second, time.Hour, 100000, 0, 15 * time.Second},
		{"an eighth kept already", 30 * time.Second, time.Hour, 1024, 128, 0},
		{"under an eighth", 30 * time.Second, time.Hour, 1024, 127, 15 * time.Second},
	} {
		in, err := New(nil, Config{})
		if err != nil {
			t.Fatal(err)
		}
		in.startsAckWait.Store(int64(tc.ackWait))
		in.startsMax.Store(int64(tc.maxPending))
		for i := range tc.keeps {
			in.starts.hold(fmt.Sprintf("run-%d", i), nil)
		}
		if got := in.startHold(tc.wait); got != tc.want {
			t.Errorf("%s: hold %v, want %v", tc.name, got, tc.want)
		}
	}
}
