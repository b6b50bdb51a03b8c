package e2e_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// startWithDefaults starts one executor, a planner and an injector whose default limits
// are d (what TOOLBUS_MAX_STEPS, TOOLBUS_RUN_TIMEOUT and TOOLBUS_TOKEN_BUDGET set).
func (s *stack) startWithDefaults(d toolbus.DefaultLimits, extra worker.Config) {
	s.startExecutor("executor-1", extra)
	cat, err := s.bus.Store().WatchCatalog(s.ctx, s.log)
	if err != nil {
		s.t.Fatal(err)
	}
	p := must(planner.New(s.bus, s.model, cat, planner.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "planner-1", Logger: s.log, Grace: time.Second}, Defaults: d}))
	s.start("planner-1", p.Run)
	in := must(injector.New(s.bus, injector.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "injector-1", Logger: s.log, Grace: time.Second}, Rules: s.rules, Defaults: d}))
	s.start("injector-1", in.Run)
}

// usageScript asks for a noop call at every step and reports 100 tokens per step.
func usageScript() planner.Model {
	return &planner.Script{Steps: []func(planner.Request) planner.Response{
		func(req planner.Request) planner.Response {
			r := planner.Calls(call("n"+strconv.Itoa(req.Step), "noop", `{}`))(req)
			r.Usage = toolbus.Usage{InputTokens: 80, OutputTokens: 20}
			return r
		},
	}}
}

func wantLimit(t *testing.T, ended toolbus.RunEnded, code string, steps int) {
	t.Helper()
	if ended.Status != toolbus.RunLimitReached || ended.Code != code || ended.StepsUsed != steps || ended.Reason == "" {
		t.Fatalf("outcome %s/%s after %d step(s) (%s), want limit_reached/%s after %d", ended.Status, ended.Code,
			ended.StepsUsed, ended.Reason, code, steps)
	}
}

func anyEnd(s *stack, run string) toolbus.RunEnded {
	return s.waitEnd(run, toolbus.RunCompleted, toolbus.RunFailed, toolbus.RunLimitReached, toolbus.RunCancelled)
}

func TestBudgetMaxSteps(t *testing.T) {
	t.Parallel()
	s := newStack(t, usageScript())
	s.startWithDefaults(toolbus.DefaultLimits{MaxSteps: 2}, worker.Config{})
	t.Run("default", func(t *testing.T) {
		s.submit("steps-default", toolbus.Limits{})
		ended := anyEnd(s, "steps-default")
		wantLimit(t, ended, toolbus.LimitMaxSteps, 2)
		if ended.Usage.Total() != 200 {
			t.Fatalf("usage %+v, want 200 tokens", ended.Usage)
		}
	})
	t.Run("per run", func(t *testing.T) {
		s.submit("steps-run", toolbus.Limits{MaxSteps: 4})
		wantLimit(t, anyEnd(s, "steps-run"), toolbus.LimitMaxSteps, 4)
		if n := countType(s.runEvents("steps-run"), events.TypeModelRequested); n != 4 {
			t.Fatalf("%d model.requested, want 4", n)
		}
	})
}

func TestBudgetTokens(t *testing.T) {
	t.Parallel()
	s := newStack(t, usageScript())
	s.startWithDefaults(toolbus.DefaultLimits{TokenBudget: 150}, worker.Config{})
	t.Run("default", func(t *testing.T) {
		s.submit("tokens-default", toolbus.Limits{})
		ended := anyEnd(s, "tokens-default")
		wantLimit(t, ended, toolbus.LimitTokenBudget, 2)
		if ended.Usage.Total() != 200 {
			t.Fatalf("usage %+v, want 200", ended.Usage)
		}
		// The step that went over the budget runs none of its calls.
		if n := len(s.finished("tokens-default")); n != 1 {
			t.Fatalf("%d results, want 1", n)
		}
	})
	t.Run("per run", func(t *testing.T) {
		s.submit("tokens-run", toolbus.Limits{TokenBudget: 350})
		wantLimit(t, anyEnd(s, "tokens-run"), toolbus.LimitTokenBudget, 4)
	})
}

func TestBudgetDeadline(t *testing.T) {
	t.Parallel()
	started, ended := make(chan string, 8), make(chan error, 8)
	model := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("h", "hold", `{}`)),
	}}
	s := newStack(t, model, holdTool(started, ended))
	s.startWithDefaults(toolbus.DefaultLimits{RunTimeout: 500 * time.Millisecond}, worker.Config{})
	t.Run("default", func(t *testing.T) {
		// The run has no deadline: the default one (start + 500ms) ends the call that
		// holds and then the run.
		s.submit("deadline-default", toolbus.Limits{})
		wantLimit(t, anyEnd(s, "deadline-default"), toolbus.LimitDeadline, 1)
		if r, ok := s.resultOf("deadline-default", 0, "h"); !ok || r.Status != toolbus.StatusTimedOut {
			t.Fatalf("result %+v", r)
		}
	})
	t.Run("per run", func(t *testing.T) {
		s.submit("deadline-run", toolbus.Limits{Deadline: time.Now().Add(300 * time.Millisecond)})
		wantLimit(t, anyEnd(s, "deadline-run"), toolbus.LimitDeadline, 1)
	})
	t.Run("already passed", func(t *testing.T) {
		s.submit("deadline-passed", toolbus.Limits{Deadline: time.Now().Add(-time.Second)})
		wantLimit(t, anyEnd(s, "deadline-passed"), toolbus.LimitDeadline, 0)
		if _, ok := s.seenReq.forStep("deadline-passed", 0); ok {
			t.Fatal("the model was called after the deadline")
		}
	})
}
