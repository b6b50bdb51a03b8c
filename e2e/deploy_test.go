package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/planner"
)

// sideEffects counts executions per idempotency key.
type sideEffects struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *sideEffects) add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	s.n[key]++
}

func (s *sideEffects) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.n))
	for k, v := range s.n {
		out[k] = v
	}
	return out
}

// A saturated pair of executors (concurrency 1 each, a 1 s ack wait, calls slower than
// the ack wait, more calls than slots) leaves calls waiting in client buffers past
// their ack wait, so they are redelivered while still buffered. Each call still runs
// exactly once: the claim taken before a tool runs turns the second delivery away.
func TestSaturatedExecutorRunsNothingTwice(t *testing.T) {
	t.Parallel()
	const calls = 6
	var fx sideEffects
	slow := executor.Tool{
		Name: "slow_effect", Description: "sleeps 1.5 s, then counts a side effect",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			select {
			case <-time.After(1500 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			fx.add(ci.IdempotencyKey)
			return map[string]string{"key": ci.IdempotencyKey}, nil
		},
	}
	cs := make([]toolbus.ToolCall, calls)
	for i := range cs {
		cs[i] = call(fmt.Sprintf("c%d", i), "slow_effect", `{}`)
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{planner.Calls(cs...), planner.Answer("done")}}
	s := newStack(t, model, slow)
	for _, name := range []string{"sat-1", "sat-2"} {
		s.startExecutor(name, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Concurrency: 1, AckWait: time.Second, MaxDeliver: 50}, Tools: []string{"slow_effect"}})
	}
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	s.submit("sat", toolbus.Limits{})
	if ended := s.waitEnd("sat"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("run ended %+v", ended)
	}
	got := fx.counts()
	for i := 0; i < calls; i++ {
		key := fmt.Sprintf("sat/0/c%d", i)
		if got[key] != 1 {
			t.Errorf("%s ran %d times", key, got[key])
		}
	}
	if len(got) != calls {
		t.Errorf("side effects %v", got)
	}
	res := s.finished("sat")
	if len(res) != calls {
		t.Fatalf("%d results for %d calls", len(res), calls)
	}
	ci, err := s.bus.QueueStream().Consumer(s.ctx, events.ToolConsumer("slow_effect"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("queue redeliveries while saturated: %d", ci.CachedInfo().NumRedelivered)
}

// The example of docs/writing-tools.md's "Deploy your own tools" runs as its own process beside
// the built-in fleet: its tool enters the catalog with its instance, a run calls it and
// a built-in tool in one step, and when the process stops its tool leaves the catalog.
func TestCustomExecutorExample(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and starts a process")
	}
	bin := filepath.Join(t.TempDir(), "custom-executor")
	build := exec.Command("go", "build", "-o", bin, "./examples/custom-executor")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the example: %v\n%s", err, out)
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("s", "shout", `{"text":"hello"}`), call("d", "calculator", `{"expression":"2*21"}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model)
	s.startAll()
	cat, err := s.bus.Store().WatchCatalog(s.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}

	var logs strings.Builder
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "TOOLBUS_NATS_URL="+s.srv.URL, "TOOLBUS_INSTANCE=shout-1", "TOOLBUS_INSTANCE_TTL=2s")
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: &logs}, &lockedWriter{w: &logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	eventstest.Eventually(t, 30*time.Second, func() error {
		if got := cat.Serving("shout"); len(got) != 1 || got[0] != "shout-1" {
			return fmt.Errorf("shout served by %v", got)
		}
		return nil
	})

	s.submit("custom", toolbus.Limits{})
	if ended := s.waitEnd("custom"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("run ended %+v", ended)
	}
	res := s.finished("custom")
	if len(res) != 2 {
		t.Fatalf("%d results", len(res))
	}
	for _, tf := range res {
		switch tf.ToolResult.Tool {
		case "shout":
			if tf.ToolResult.Executor != "shout-1" || !strings.Contains(tf.ToolResult.Content, `"shout":"HELLO!"`) ||
				!strings.Contains(tf.ToolResult.Content, `"idempotency_key":"custom/0/s"`) {
				t.Errorf("shout result %+v", tf.ToolResult)
			}
		case "calculator":
			if tf.ToolResult.Executor != "executor-1" || tf.ToolResult.Status != toolbus.StatusSucceeded {
				t.Errorf("calculator result %+v", tf.ToolResult)
			}
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if err != nil {
			t.Fatalf("example exited with %v:\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("example did not stop on SIGTERM")
	}
	eventstest.Eventually(t, 10*time.Second, func() error {
		for _, tc := range cat.Tools(nil) {
			if tc.Name == "shout" {
				return errors.New("shout still offered after its only executor stopped")
			}
		}
		return nil
	})
}

// lockedWriter serializes writes of a process's two output streams.
type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A flood run cannot take the whole fleet: it asks for 60 calls that all block until
// the test releases them, on two executors of 8 slots each, with a per-run cap of 4
// calls in flight across the fleet. A small run started after it, calling the same
// tool, completes while every flood call is still held (without the cap the flood would
// fill all 16 slots and the small run would wait forever), and the flood never has
// more than 4 calls running at once. Nothing here depends on timing.
func TestRunCapLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	const floodCalls, limit = 60, 4
	var (
		mu            sync.Mutex
		running, peak = map[string]int{}, map[string]int{}
		floodFinished int
	)
	release := make(chan struct{})
	held := executor.Tool{
		Name: "held_call", Description: "the flood's calls wait for the test", InputSchema: json.RawMessage(`{"type":"object"}`),
		Timeout: 5 * time.Minute,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			mu.Lock()
			running[ci.RunID]++
			peak[ci.RunID] = max(peak[ci.RunID], running[ci.RunID])
			mu.Unlock()
			defer func() {
				mu.Lock()
				running[ci.RunID]--
				if ci.RunID == "flood" {
					floodFinished++
				}
				mu.Unlock()
			}()
			if ci.RunID != "flood" {
				return "ok", nil
			}
			select {
			case <-release:
				return "ok", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}
	flood := make([]toolbus.ToolCall, floodCalls)
	for i := range flood {
		flood[i] = call(fmt.Sprintf("f%d", i), "held_call", `{}`)
	}
	model := planner.ModelFunc(func(_ context.Context, req planner.Request) (planner.Response, error) {
		if req.Step > 0 {
			return planner.Answer("done")(req), nil
		}
		if req.RunID == "flood" {
			return planner.Calls(flood...)(req), nil
		}
		return planner.Calls(call("s0", "held_call", `{}`))(req), nil
	})
	s := newStack(t, model, held)
	for _, name := range []string{"fair-1", "fair-2"} {
		s.startExecutor(name, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Concurrency: 8}, RunMaxInFlight: limit, Tools: []string{"held_call"}})
	}
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	s.submit("flood", toolbus.Limits{})
	eventstest.Eventually(t, time.Minute, func() error {
		mu.Lock()
		defer mu.Unlock()
		if running["flood"] != limit {
			return fmt.Errorf("flood has %d calls running, want its cap %d", running["flood"], limit)
		}
		return nil
	})
	s.submit("small", toolbus.Limits{})
	if ended := s.waitEnd("small"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("small run ended %+v", ended)
	}
	mu.Lock()
	if floodFinished != 0 {
		t.Errorf("%d flood calls finished while all were held", floodFinished)
	}
	mu.Unlock()
	close(release)
	if ended := s.waitEnd("flood"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("flood ended %+v", ended)
	}
	mu.Lock()
	defer mu.Unlock()
	if peak["flood"] != limit {
		t.Errorf("flood had at most %d calls in flight at once, want exactly its cap %d", peak["flood"], limit)
	}
	if floodFinished != floodCalls {
		t.Errorf("%d flood calls ran, want %d", floodFinished, floodCalls)
	}
}
