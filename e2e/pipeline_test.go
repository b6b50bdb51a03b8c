package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/planner"
)

var objectSchema = json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"additionalProperties":false}`)

// orderedTool finishes its calls in reverse order of n: the call with n waits until the
// results of every higher n are published (watched on the bus), so the stream holds the
// results in reverse call order.
func orderedTool(t *testing.T, total int) (executor.Tool, func(*nats.Conn)) {
	var (
		mu   sync.Mutex
		cond = sync.NewCond(&mu)
		done = map[int]bool{}
	)
	watch := func(nc *nats.Conn) {
		sub, err := nc.Subscribe("toolbus.*.tool.finished.ordered", func(m *nats.Msg) {
			var tf toolbus.ToolFinished
			if _, err := events.Decode(m, &tf); err != nil {
				t.Errorf("decode: %v", err)
				return
			}
			var out struct{ N int }
			_ = json.Unmarshal([]byte(tf.ToolResult.Content), &out)
			mu.Lock()
			done[out.N] = true
			cond.Broadcast()
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	return executor.Tool{
		Name: "ordered", Description: "finishes in reverse order", InputSchema: objectSchema, ReadOnly: true,
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			var in struct{ N int }
			if err := json.Unmarshal(args, &in); err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			for {
				ready := true
				for k := in.N + 1; k < total; k++ {
					if !done[k] {
						ready = false
					}
				}
				if ready || ctx.Err() != nil {
					break
				}
				cond.Wait()
			}
			return map[string]int{"n": in.N}, nil
		},
	}, watch
}

func call(id, tool, args string) toolbus.ToolCall {
	return toolbus.ToolCall{CallID: id, Tool: tool, Arguments: args}
}

func TestStepInjectedInCallOrder(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "ordered", `{"n":0}`), call("b", "ordered", `{"n":1}`), call("c", "ordered", `{"n":2}`)),
		planner.Answer("done"),
	}}
	tool, watch := orderedTool(t, 3)
	s := newStack(t, model, tool)
	watch(s.srv.Conn)
	s.startAll()
	s.submit("order-1", toolbus.Limits{})
	ended := s.waitEnd("order-1")
	if ended.Status != toolbus.RunCompleted {
		t.Fatalf("status %s (%s), want completed", ended.Status, ended.Reason)
	}
	var finishOrder []string
	for _, tf := range s.finished("order-1") {
		finishOrder = append(finishOrder, tf.ToolResult.CallID)
	}
	if fmt.Sprint(finishOrder) != "[c b a]" {
		t.Fatalf("finish order %v: the test needs the calls to finish in reverse", finishOrder)
	}
	req, ok := s.seenReq.forStep("order-1", 1)
	if !ok {
		t.Fatal("no model request for step 1")
	}
	if got, want := toolRoles(req.Messages), "system,user,assistant,tool:a,tool:b,tool:c"; got != want {
		t.Fatalf("history %s, want %s", got, want)
	}
	for i, m := range req.Messages[3:] {
		var out struct{ N int }
		if err := json.Unmarshal([]byte(m.Content), &out); err != nil || out.N != i {
			t.Fatalf("tool message %d content %q", i, m.Content)
		}
	}
}

func TestRunOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		steps  []func(planner.Request) planner.Response
		limits toolbus.Limits
		want   toolbus.RunStatus
		code   string
	}{
		{"unknown tool fails the run", []func(planner.Request) planner.Response{
			planner.Calls(call("x", "no_such_tool", `{}`)), planner.Answer("unreachable")},
			toolbus.Limits{}, toolbus.RunFailed, toolbus.CodeUnknownTool},
		{"invalid tool name fails the run", []func(planner.Request) planner.Response{
			planner.Calls(call("x", "bad name.with*chars", `{}`)), planner.Answer("unreachable")},
			toolbus.Limits{}, toolbus.RunFailed, toolbus.CodeUnknownTool},
		{"panic fails the run", []func(planner.Request) planner.Response{
			planner.Calls(call("x", "panic", `{}`)), planner.Answer("unreachable")},
			toolbus.Limits{}, toolbus.RunFailed, toolbus.CodeToolInternalError},
		{"invalid output fails the run", []func(planner.Request) planner.Response{
			planner.Calls(call("x", "bad_output", `{}`)), planner.Answer("unreachable")},
			toolbus.Limits{}, toolbus.RunFailed, toolbus.CodeInvalidToolOutput},
		{"malformed arguments go back to the model", []func(planner.Request) planner.Response{
			planner.Calls(call("x", "calculator", `{"expression": "1+1",}`)), planner.Answer("repaired")},
			toolbus.Limits{}, toolbus.RunCompleted, ""},
		{"max steps", []func(planner.Request) planner.Response{
			planner.Calls(call("x", "noop", `{}`))},
			toolbus.Limits{MaxSteps: 3}, toolbus.RunLimitReached, toolbus.LimitMaxSteps},
		{"no tool calls completes", []func(planner.Request) planner.Response{planner.Answer("42")},
			toolbus.Limits{}, toolbus.RunCompleted, ""},
	}
	s := newStack(t, planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		return scripts[req.RunID].Complete(ctx, req)
	}))
	for i, tc := range tests {
		scripts["outcome-"+strconv.Itoa(i)] = &planner.Script{Steps: tc.steps}
	}
	s.startAll()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run := "outcome-" + strconv.Itoa(i)
			s.submit(run, tc.limits)
			ended := s.waitEnd(run)
			if ended.Status != tc.want || ended.Code != tc.code {
				t.Fatalf("got %s/%s (%s), want %s/%s", ended.Status, ended.Code, ended.Reason, tc.want, tc.code)
			}
			if tc.code == toolbus.LimitMaxSteps && ended.StepsUsed != tc.limits.MaxSteps {
				t.Fatalf("steps used %d, want %d", ended.StepsUsed, tc.limits.MaxSteps)
			}
			evs := s.runEvents(run)
			if n := countType(evs, events.TypeToolRequested); n != countType(evs, events.TypeToolFinished) {
				t.Fatalf("%d requests but %d results", n, countType(evs, events.TypeToolFinished))
			}
		})
	}
}

var scripts = map[string]*planner.Script{}

func TestSelfRepair(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("call_0", "lookup_incident", `{"incident_id":"INC-404"}`)),
		func(req planner.Request) planner.Response {
			last := req.Messages[len(req.Messages)-1]
			if last.Role != toolbus.RoleTool || !last.IsError {
				return planner.Answer("unexpected: " + last.Content)(req)
			}
			return planner.Calls(call("call_0", "lookup_incident", `{"incident_id":"INC-001"}`))(req)
		},
		func(req planner.Request) planner.Response {
			return planner.Answer("final: " + req.Messages[len(req.Messages)-1].Content)(req)
		},
	}}
	s := newStack(t, model)
	s.startAll()
	s.submit("repair-1", toolbus.Limits{})
	ended := s.waitEnd("repair-1")
	if ended.Status != toolbus.RunCompleted || ended.StepsUsed != 3 {
		t.Fatalf("got %s after %d steps (%s)", ended.Status, ended.StepsUsed, ended.Reason)
	}
	res := s.finished("repair-1")
	if len(res) != 2 || res[0].ToolResult.Code() != "incident_not_found" || res[1].ToolResult.Status != toolbus.StatusSucceeded {
		t.Fatalf("results %+v", res)
	}
	// call_0 is reused at every step (some OpenAI-compatible servers do): no collision.
	req, _ := s.seenReq.forStep("repair-1", 2)
	if got, want := toolRoles(req.Messages), "system,user,assistant,tool:call_0,assistant,tool:call_0"; got != want {
		t.Fatalf("history %s, want %s", got, want)
	}
	if !req.Messages[3].IsError || req.Messages[5].IsError {
		t.Fatalf("error flags wrong: %+v", req.Messages)
	}
}

func TestTwoExecutorsShareTheLoad(t *testing.T) {
	t.Parallel()
	var runs sync.Map // idempotency key -> *int64
	counting := executor.Tool{
		Name: "count", Description: "counts its runs", InputSchema: objectSchema, ReadOnly: false,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			ci, _ := executor.CallInfoFrom(ctx)
			v, _ := runs.LoadOrStore(ci.IdempotencyKey, new(int64))
			atomic.AddInt64(v.(*int64), 1)
			time.Sleep(2 * time.Millisecond) // let both workers take calls
			return map[string]string{"key": ci.IdempotencyKey}, nil
		},
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "count", `{}`), call("b", "count", `{}`), call("c", "count", `{}`), call("d", "count", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, counting)
	s.startExecutor("exec-a", worker.Config{WorkerConfig: workerconfig.WorkerConfig{Concurrency: 4}})
	s.startExecutor("exec-b", worker.Config{WorkerConfig: workerconfig.WorkerConfig{Concurrency: 4}})
	s.startPlanner("planner-1")
	s.startInjector("injector-1")
	const n = 20
	for i := 0; i < n; i++ {
		s.submit("share-"+strconv.Itoa(i), toolbus.Limits{})
	}
	byExecutor := map[string]int{}
	for i := 0; i < n; i++ {
		run := "share-" + strconv.Itoa(i)
		if ended := s.waitEnd(run); ended.Status != toolbus.RunCompleted {
			t.Fatalf("%s: %s %s", run, ended.Status, ended.Reason)
		}
		for _, tf := range s.finished(run) {
			byExecutor[tf.ToolResult.Executor]++
		}
	}
	total := 0
	runs.Range(func(k, v any) bool {
		total++
		if c := atomic.LoadInt64(v.(*int64)); c != 1 {
			t.Errorf("call %v ran %d times", k, c)
		}
		return true
	})
	if total != 4*n {
		t.Fatalf("%d distinct calls ran, want %d", total, 4*n)
	}
	if byExecutor["exec-a"] == 0 || byExecutor["exec-b"] == 0 || byExecutor["exec-a"]+byExecutor["exec-b"] != 4*n {
		t.Fatalf("load split %v", byExecutor)
	}
}

func TestInjectorRestartMidStep(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	blocking := executor.Tool{
		Name: "block", Description: "waits for the test", InputSchema: objectSchema, ReadOnly: true,
		Func: func(ctx context.Context, _ json.RawMessage) (any, error) {
			select {
			case <-release:
				return "released", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "block", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, model, blocking)
	s.startAll()
	s.submit("restart-1", toolbus.Limits{})
	// The first result is joined by injector-1...
	eventstest.Eventually(t, 10*time.Second, func() error {
		rec, _, err := s.bus.Store().Step(s.ctx, "restart-1", 0)
		if err != nil {
			return err
		}
		if rec.Received() != 1 {
			return fmt.Errorf("%d results joined", rec.Received())
		}
		return nil
	})
	s.stop("injector-1")
	close(release)
	// ...the second arrives while no injector runs; a new one completes the step.
	eventstest.Eventually(t, 10*time.Second, func() error {
		if len(s.finished("restart-1")) != 2 {
			return fmt.Errorf("second result not yet published")
		}
		return nil
	})
	s.startInjector("injector-2")
	if ended := s.waitEnd("restart-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("status %s (%s)", ended.Status, ended.Reason)
	}
	if n := countType(s.runEvents("restart-1"), events.TypeModelRequested); n != 2 {
		t.Fatalf("%d model.requested, want 2", n)
	}
}

func TestPoisonMessageTerminated(t *testing.T) {
	t.Parallel()
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`)), planner.Answer("done"),
	}}
	s := newStack(t, model)
	advisories := make(chan *nats.Msg, 16)
	sub, err := s.srv.Conn.ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>", advisories)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	s.startAll()
	poison := []struct{ subject, body string }{
		{"toolbus.poison.tool.requested.noop", "not a cloudevent"},
		{"toolbus.poison.model.requested", `{"run_id":"poison","step":0}`},
		{"toolbus.poison.tool.finished.noop", "\x00\x01garbage"},
	}
	for _, p := range poison {
		if _, err := s.srv.JS.Publish(s.ctx, p.subject, []byte(p.body)); err != nil {
			t.Fatal(err)
		}
	}
	// A CloudEvent whose data is garbage.
	bad, err := events.Encode("toolbus.poison2.tool.requested.noop", events.Meta{ID: "bad-1", Type: events.TypeToolRequested, Source: "/test"}, "just a string")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.srv.JS.PublishMsg(s.ctx, bad); err != nil {
		t.Fatal(err)
	}
	s.submit("after-poison", toolbus.Limits{})
	if ended := s.waitEnd("after-poison"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("status %s (%s)", ended.Status, ended.Reason)
	}
	got := 0
	timeout := time.After(10 * time.Second)
	for got < len(poison)+1 {
		select {
		case <-advisories:
			got++
		case <-timeout:
			t.Fatalf("%d termination advisories, want %d", got, len(poison)+1)
		}
	}
}

// A tool that hangs and ignores its context gets timed_out at its own timeout; the
// result goes back to the model (timeout is recoverable) and the run completes.
func TestHangingToolTimesOut(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	hang := executor.Tool{
		Name: "hang", Description: "never returns on its own", InputSchema: objectSchema, ReadOnly: true,
		Timeout: 200 * time.Millisecond,
		Func: func(context.Context, json.RawMessage) (any, error) {
			<-release // ignores ctx on purpose
			return nil, nil
		},
	}
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("h", "hang", `{}`), call("n", "noop", `{}`)),
		func(req planner.Request) planner.Response {
			return planner.Answer("saw: " + req.Messages[len(req.Messages)-2].Content)(req)
		},
	}}
	s := newStack(t, model, hang)
	s.startAll()
	s.submit("hang-1", toolbus.Limits{})
	ended := s.waitEnd("hang-1")
	if ended.Status != toolbus.RunCompleted || !strings.Contains(ended.Answer, toolbus.CodeTimeout) {
		t.Fatalf("got %s (%s), answer %q: the model should have read the timeout", ended.Status, ended.Reason, ended.Answer)
	}
	for _, tf := range s.finished("hang-1") {
		if tf.ToolResult.CallID == "h" && (tf.ToolResult.Status != toolbus.StatusTimedOut || tf.ToolResult.Code() != toolbus.CodeTimeout) {
			t.Fatalf("hanging call: %+v", tf.ToolResult)
		}
	}
}
