package fair_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/e2e/testpipe"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/fair"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/timeline"
)

// gate is a tool whose calls block until the test lets them go, recording who called
// (its argument) in the order they started: the order the executor got them.
type gate struct {
	started chan string
	release chan struct{}
	mu      sync.Mutex
	order   []string
	runs    map[string]int // side effects per call id
}

func newGate() *gate {
	return &gate{started: make(chan string, 256), release: make(chan struct{}, 256), runs: map[string]int{}}
}

func (g *gate) tool() executor.Tool {
	return executor.Tool{Name: "gate", Description: "waits for the test", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			var a struct{ Who, ID string }
			if err := json.Unmarshal(args, &a); err != nil {
				return nil, err
			}
			g.mu.Lock()
			g.order = append(g.order, a.Who)
			g.runs[a.ID]++
			g.mu.Unlock()
			g.started <- a.Who
			select {
			case <-g.release:
				return "ok", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}}
}

// next waits for the next call to start and returns who called.
func (g *gate) next(t *testing.T) string {
	t.Helper()
	select {
	case who := <-g.started:
		return who
	case <-time.After(time.Minute):
		t.Fatal("no call of gate started within a minute")
		return ""
	}
}

// rig is a pipeline (planner, injector) on a bus with fair share on or off, an executor
// of gate with the concurrency given, and, with fair share, the scheduler.
type rig struct {
	p       *testpipe.Pipeline
	g       *gate
	scheds  int
	shares  fair.Shares
	scripts map[string]*planner.Script
	minRun  time.Duration // how long drain lets each call run
}

func newRig(t *testing.T, fairShare bool, concurrency int, shares fair.Shares) *rig {
	r := newRigIdle(t, fairShare, concurrency, shares)
	if fairShare {
		r.startScheduler(t)
	}
	return r
}

// newRigIdle is newRig without the scheduler: calls stay staged until the test starts it.
func newRigIdle(t *testing.T, fairShare bool, concurrency int, shares fair.Shares) *rig {
	r := &rig{g: newGate(), shares: shares, scripts: map[string]*planner.Script{}}
	r.p = testpipe.StartWith(t, 3*time.Minute, testpipe.ScriptByRun(r.scripts, nil), testpipe.Options{Bus: events.Config{FairShare: fairShare}})
	reg := executor.NewRegistry()
	if err := reg.Register(r.g.tool()); err != nil {
		t.Fatal(err)
	}
	exec := testutil.Must(executor.New(reg, executor.WithInstance("gate-1")))
	r.p.Roles.Go("gate-1", testutil.Must(worker.New(r.p.Bus, exec, worker.Config{
		WorkerConfig: workerconfig.WorkerConfig{Instance: "gate-1", Logger: r.p.Log, Grace: time.Second, Concurrency: concurrency}})).Run)
	r.p.WaitTools("gate")
	return r
}

func (r *rig) startScheduler(t *testing.T) {
	s, err := fair.New(r.p.Ctx, r.p.Bus, r.shares, r.p.Log)
	if err != nil {
		t.Fatal(err)
	}
	r.p.Roles.Go("fair", s.Run)
}

// flood starts run for who with n calls of gate in one step.
func (r *rig) flood(t *testing.T, run, who string, n int) {
	var calls []toolbus.ToolCall
	for i := range n {
		id := fmt.Sprintf("%s-c%d", run, i)
		calls = append(calls, toolbus.ToolCall{CallID: id, Tool: "gate", Arguments: fmt.Sprintf(`{"who":%q,"id":%q}`, who, id)})
	}
	r.scripts[run] = &planner.Script{Steps: []func(planner.Request) planner.Response{planner.Calls(calls...), planner.Answer("done")}}
	r.p.SubmitAs(run, who, "go", toolbus.Limits{})
	r.waitRequested(t, run, n)
}

// waitRequested waits until run's n calls are stored.
func (r *rig) waitRequested(t *testing.T, run string, n int) {
	eventstest.Eventually(t, time.Minute, func() error {
		evs, err := runlog.Events(r.p.Ctx, r.p.Bus, run)
		if err != nil {
			return err
		}
		got := 0
		for _, e := range evs {
			if e.Meta.Type == events.TypeToolRequested {
				got++
			}
		}
		if got < n {
			return fmt.Errorf("run %s: %d of %d calls stored", run, got, n)
		}
		return nil
	})
}

// held asks the scheduler what it holds of gate.
func (r *rig) held(t *testing.T) map[string]fair.Held {
	msg, err := r.p.Bus.Conn().Request(events.FairHeldSubject("gate"), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var hs []fair.Held
	if err := json.Unmarshal(msg.Data, &hs); err != nil {
		t.Fatal(err)
	}
	out := map[string]fair.Held{}
	for _, h := range hs {
		out[h.Tenant] = h
	}
	return out
}

// waitHeld waits until the scheduler has calls of who, queued or released (it has read them).
func (r *rig) waitHeld(t *testing.T, who string, queued int) {
	eventstest.Eventually(t, time.Minute, func() error {
		if h := r.held(t)[who]; h.Queued+h.InFlight < queued {
			return fmt.Errorf("the scheduler has %d calls of %s, want %d", h.Queued+h.InFlight, who, queued)
		}
		return nil
	})
}

// waitQueue waits until gate's queue holds n calls, pending or delivered to its executor
// (which takes a few ahead of its slots).
func (r *rig) waitQueue(t *testing.T, n int) {
	eventstest.Eventually(t, time.Minute, func() error {
		q, err := r.p.Bus.ToolQueueInfo(r.p.Ctx, "gate")
		if err != nil {
			return err
		}
		if int(q.Pending)+q.InFlight < n {
			return fmt.Errorf("gate's queue has %d pending and %d delivered, want %d", q.Pending, q.InFlight, n)
		}
		return nil
	})
}

// drain lets n calls go one by one and returns who called, in start order.
func (r *rig) drain(t *testing.T, n int) []string {
	var order []string
	for range n {
		order = append(order, r.g.next(t))
		if r.minRun > 0 {
			<-time.After(r.minRun) // the call's run time, which the credit window reads
		}
		r.g.release <- struct{}{}
	}
	return order
}

func position(order []string, who string) int {
	for i, w := range order {
		if w == who {
			return i
		}
	}
	return -1
}

// TestQuietTenantGoesAhead: one executor runs one call at a time; alice floods 20 calls,
// then bob makes one. With fair share bob's call starts among the first few (behind the
// call running and the lookahead released to the executor), not after alice's
// backlog. The control, without fair share (one FIFO queue), runs it last.
func TestQuietTenantGoesAhead(t *testing.T) {
	for _, fairShare := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fairShare), func(t *testing.T) {
			r := newRig(t, fairShare, 1, fair.Shares{})
			r.flood(t, "alice-1", "alice", 20)
			first := r.g.next(t) // alice's first call runs; the executor is full
			r.scripts["bob-1"] = &planner.Script{Steps: []func(planner.Request) planner.Response{
				planner.Calls(toolbus.ToolCall{CallID: "b", Tool: "gate", Arguments: `{"who":"bob","id":"bob-1-b"}`}), planner.Answer("done")}}
			r.p.SubmitAs("bob-1", "bob", "go", toolbus.Limits{})
			r.waitRequested(t, "bob-1", 1)
			if fairShare {
				eventstest.Eventually(t, time.Minute, func() error {
					if h := r.held(t)["bob"]; h.Queued+h.InFlight == 0 {
						return fmt.Errorf("the scheduler has not read bob's call yet")
					}
					return nil
				})
			} else {
				r.waitQueue(t, 21)
			}
			r.g.release <- struct{}{}
			order := append([]string{first}, r.drain(t, 20)...)
			pos := position(order, "bob")
			t.Logf("fair=%v: bob's call started %d of %d: %v", fairShare, pos+1, len(order), order)
			if fairShare && pos > 4 {
				t.Fatalf("with fair share bob's call started %d of 21, behind alice's backlog; want among the first 5", pos+1)
			}
			if !fairShare && pos != 20 {
				t.Fatalf("without fair share bob's call started %d of 21; the control wants it last (one FIFO)", pos+1)
			}
			r.p.WaitStatus("alice-1", toolbus.RunCompleted)
			r.p.WaitStatus("bob-1", toolbus.RunCompleted)
		})
	}
}

// TestWeightsShareTheTool: alice and bob both flood one executor (one call at a time);
// with weights alice=3, bob=1 alice gets about three calls of four once both wait, and
// with equal weights (the control) half: under each release window. The credit window
// serves calls of 50 ms or more (shorter ones get pace), so under it the calls run 60 ms.
func TestWeightsShareTheTool(t *testing.T) {
	for _, window := range []string{"pace", "credit"} {
		for _, weights := range []string{"alice=3,bob=1", ""} {
			t.Run(window+"/weights="+weights, func(t *testing.T) {
				r := newRig(t, true, 1, fair.Shares{Weights: weights, Window: window})
				if window == "credit" {
					r.minRun = 60 * time.Millisecond
				}
				r.flood(t, "alice-1", "alice", 16)
				first := r.g.next(t)
				r.flood(t, "bob-1", "bob", 16)
				r.waitHeld(t, "bob", 16)
				r.g.release <- struct{}{}
				order := append([]string{first}, r.drain(t, 15)...)
				r.minRun = 0 // the shares are read in the first 16
				order = append(order, r.drain(t, 16)...)
				// Skip what was released before bob's calls were read: alice's first calls.
				alice := 0
				for _, w := range order[4:16] {
					if w == "alice" {
						alice++
					}
				}
				t.Logf("%s window, weights %q: alice ran %d of the 12 calls after both waited: %v", window, weights, alice, order)
				if weights != "" && (alice < 8 || alice > 10) {
					t.Fatalf("%s window, weights alice=3,bob=1: alice ran %d of 12, want 9 (+-1)", window, alice)
				}
				if weights == "" && (alice < 5 || alice > 7) {
					t.Fatalf("%s window, equal weights: alice ran %d of 12, want 6 (+-1)", window, alice)
				}
			})
		}
	}
}

// TestTenantAloneGetsAllSlots: the scheduler is work-conserving: a tenant alone with a
// backlog fills every slot of the executor (4), not a share of them.
func TestTenantAloneGetsAllSlots(t *testing.T) {
	r := newRig(t, true, 4, fair.Shares{Weights: "alice=1,bob=3", Minimum: "bob=2"})
	r.flood(t, "alice-1", "alice", 12)
	for range 4 {
		if who := r.g.next(t); who != "alice" {
			t.Fatalf("%s started, want alice", who)
		}
	}
	// Four calls run at once, none let go: alice holds all four slots.
	for range 4 {
		r.g.release <- struct{}{}
	}
	r.drain(t, 8)
	r.p.WaitStatus("alice-1", toolbus.RunCompleted)
}

// TestConcurrencyKeyQueues: with a cap of 2 calls of gate per tenant, alice's flood runs
// two at a time though the executor has four slots; the rest are queued, and the
// scheduler says so in the words `toolbus call` prints; bob still gets a free slot.
func TestConcurrencyKeyQueues(t *testing.T) {
	r := newRig(t, true, 4, fair.Shares{Caps: "gate=2"})
	r.flood(t, "alice-1", "alice", 6)
	r.g.next(t)
	r.g.next(t)
	var h fair.Held
	eventstest.Eventually(t, time.Minute, func() error {
		if h = r.held(t)["alice"]; !h.AtCap || h.Queued != 4 || h.InFlight != 2 {
			return fmt.Errorf("alice: %+v, want 2 in flight at the cap and 4 queued", h)
		}
		return nil
	})
	want := "queued: tenant alice has 2 calls of gate in flight, its cap (4 queued)"
	if got := h.Reason("gate"); got != want {
		t.Fatalf("reason %q, want %q", got, want)
	}
	// `toolbus call` and `toolbus run` say so in their waiting line.
	pr := timeline.NewPrinter(io.Discard)
	evs, err := runlog.Events(r.p.Ctx, r.p.Bus, "alice-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		pr.Print(ev)
	}
	if line := timeline.WaitingHint(r.p.Ctx, r.p.Bus, pr); !strings.Contains(line, want) {
		t.Fatalf("waiting line %q does not say %q", line, want)
	}
	// Nothing more of alice's reached the executor, which has two free slots.
	if q, err := r.p.Bus.ToolQueueInfo(r.p.Ctx, "gate"); err != nil || q.Pending != 0 || q.InFlight != 2 {
		t.Fatalf("gate's queue: %+v (%v), want 0 pending and 2 running", q, err)
	}
	// Another tenant is not held by alice's cap: bob's call takes a free slot.
	r.flood(t, "bob-1", "bob", 1)
	if who := r.g.next(t); who != "bob" {
		t.Fatalf("%s started, want bob", who)
	}
	for range 3 {
		r.g.release <- struct{}{}
	}
	r.drain(t, 4) // alice's 4 queued calls go as her calls end
	r.p.WaitStatus("alice-1", toolbus.RunCompleted)
	r.p.WaitStatus("bob-1", toolbus.RunCompleted)
}

// TestSchedulerRestartLosesNothing: the scheduler stops with calls held and released;
// a new one finds where it stopped: every call runs exactly once (side effects counted).
func TestSchedulerRestartLosesNothing(t *testing.T) {
	r := newRig(t, true, 1, fair.Shares{})
	r.flood(t, "alice-1", "alice", 10)
	r.flood(t, "bob-1", "bob", 10)
	r.waitHeld(t, "bob", 8)
	order := r.drain(t, 3)
	r.p.Roles.Stop("fair")
	r.startScheduler(t)
	order = append(order, r.drain(t, 17)...)
	r.p.WaitStatus("alice-1", toolbus.RunCompleted)
	r.p.WaitStatus("bob-1", toolbus.RunCompleted)
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	if len(r.g.runs) != 20 {
		t.Fatalf("%d calls ran, want 20: %v", len(r.g.runs), r.g.runs)
	}
	for id, n := range r.g.runs {
		if n != 1 {
			t.Fatalf("call %s ran %d times", id, n)
		}
	}
	if strings.Count(strings.Join(order, ","), "alice") != 10 {
		t.Fatalf("order %v", order)
	}
}
