package packs_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/internal/testutil"
)

var principal = toolbus.Principal{ID: "packs-test"}

func newExecutor(t testing.TB, names ...string) *executor.Executor {
	t.Helper()
	reg := executor.NewRegistry()
	if err := packs.Register(reg, names...); err != nil {
		t.Fatalf("Register(%v): %v", names, err)
	}
	return testutil.Must(executor.New(reg))
}

func call(tool, args string) toolbus.ToolCall {
	return toolbus.ToolCall{CallID: "call-" + tool, Tool: tool, Arguments: args}
}

// check asserts the status and error code of r and returns r.
func check(t *testing.T, r toolbus.ToolResult, status toolbus.Status, code string) toolbus.ToolResult {
	t.Helper()
	if r.Status != status || r.Code() != code {
		t.Fatalf("%s: status %s/%s, want %s/%s\nresult: %+v", r.Tool, r.Status, r.Code(), status, code, r)
	}
	if status != toolbus.StatusSucceeded && (r.Error == nil || r.Error.Message == "") {
		t.Fatalf("%s: status %s without an error message: %+v", r.Tool, r.Status, r)
	}
	return r
}

func output[T any](t *testing.T, r toolbus.ToolResult) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.Output, &v); err != nil {
		t.Fatalf("%s: output %q: %v", r.Tool, r.Output, err)
	}
	return v
}

func TestNames(t *testing.T) {
	if got := packs.Names(); !slices.Equal(got, []string{"demo", "diag"}) {
		t.Fatalf("Names() = %v", got)
	}
	for _, name := range packs.Names() {
		if err := packs.Register(executor.NewRegistry(), name); err != nil {
			t.Errorf("Register(%q): %v", name, err)
		}
	}
}

func TestContracts(t *testing.T) {
	reg := executor.NewRegistry()
	if err := packs.Register(reg, packs.Names()...); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		readOnly bool
		required []string
	}{
		"calculator":      {true, []string{"expression"}},
		"lookup_incident": {true, []string{"incident_id"}},
		"restart_service": {false, []string{"service"}},
		"sleep":           {true, []string{"ms"}},
		"fail":            {true, nil},
		"panic":           {true, nil},
		"big_output":      {true, []string{"bytes"}},
		"bad_output":      {true, nil},
		"noop":            {true, nil},
		"counter":         {false, nil},
		"confirm":         {true, []string{"question"}},
	}
	cs := reg.Contracts()
	if len(cs) != len(want) {
		t.Errorf("registered %d tools, want %d", len(cs), len(want))
	}
	for _, c := range cs {
		w, ok := want[c.Name]
		if !ok {
			t.Errorf("unexpected tool %q", c.Name)
			continue
		}
		if len(c.Description) < 40 {
			t.Errorf("%s: description too short for a model: %q", c.Name, c.Description)
		}
		if c.ReadOnly != w.readOnly {
			t.Errorf("%s: ReadOnly = %v", c.Name, c.ReadOnly)
		}
		var s struct {
			Type                 string                     `json:"type"`
			Properties           map[string]json.RawMessage `json:"properties"`
			Required             []string                   `json:"required"`
			AdditionalProperties *bool                      `json:"additionalProperties"`
		}
		if err := json.Unmarshal(c.InputSchema, &s); err != nil {
			t.Errorf("%s: input schema: %v", c.Name, err)
			continue
		}
		if s.Type != "object" || s.AdditionalProperties == nil || *s.AdditionalProperties || s.Properties == nil {
			t.Errorf("%s: input schema is not a closed object: %s", c.Name, c.InputSchema)
		}
		if !slices.Equal(s.Required, w.required) {
			t.Errorf("%s: required = %v, want %v", c.Name, s.Required, w.required)
		}
		for _, r := range s.Required {
			if _, ok := s.Properties[r]; !ok {
				t.Errorf("%s: required %q is not a property", c.Name, r)
			}
		}
		if len(c.OutputSchema) == 0 && c.Name != "panic" && c.Name != "fail" {
			t.Errorf("%s: no output schema", c.Name)
		}
	}
}

func TestRegisterErrors(t *testing.T) {
	reg := executor.NewRegistry()
	err := packs.Register(reg, "demo", "nope")
	if !errors.Is(err, packs.ErrUnknownPack) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("Register(unknown) = %v, want ErrUnknownPack naming the pack", err)
	}
	// Nothing was registered: demo can still be added.
	if err := packs.Register(reg, "demo"); err != nil {
		t.Fatalf("Register(demo) after a failed Register: %v", err)
	}
	// Twice: the registry refuses the duplicate tool.
	err = packs.Register(reg, "demo")
	if err == nil || errors.Is(err, packs.ErrUnknownPack) {
		t.Fatalf("Register(demo) twice = %v, want a duplicate error", err)
	}
	if !errors.Is(err, executor.ErrDuplicateTool) || !strings.Contains(err.Error(), "calculator") {
		t.Errorf("duplicate error %q does not name the tool", err)
	}
	if err := packs.Register(executor.NewRegistry(), "diag", "diag"); err == nil {
		t.Fatal("Register(diag, diag) = nil, want a duplicate error")
	}
}

func TestRegisterNothing(t *testing.T) {
	reg := executor.NewRegistry()
	if err := packs.Register(reg); err != nil {
		t.Fatalf("Register() = %v", err)
	}
	if err := packs.Register(reg, []string{}...); err != nil {
		t.Fatalf("Register(empty) = %v", err)
	}
	r := testutil.Must(executor.New(reg)).Execute(context.Background(), call("calculator", `{"expression":"1"}`), principal)
	check(t, r, toolbus.StatusRejected, toolbus.CodeUnknownTool)
	// All tools can be added afterwards.
	if err := packs.Register(reg, packs.Names()...); err != nil {
		t.Fatal(err)
	}
}

func TestCalculatorTool(t *testing.T) {
	ex := newExecutor(t, "demo")
	ctx := context.Background()

	r := check(t, ex.Execute(ctx, call("calculator", `{"expression":"(2+3)*4^2 - max(1, 7)"}`), principal),
		toolbus.StatusSucceeded, "")
	if got := output[map[string]float64](t, r); got["value"] != 73 {
		t.Errorf("value = %v, want 73 (output %s)", got, r.Output)
	}
	if !strings.Contains(r.Content, "73") {
		t.Errorf("content %q does not show the value", r.Content)
	}

	r = check(t, ex.Execute(ctx, call("calculator", `{"expression":"1/(3-3)"}`), principal),
		toolbus.StatusFailed, packs.CodeDivisionByZero)
	if !strings.Contains(r.Error.Message, "position 2") {
		t.Errorf("message %q has no position", r.Error.Message)
	}
	r = check(t, ex.Execute(ctx, call("calculator", `{"expression":"2 +"}`), principal),
		toolbus.StatusFailed, packs.CodeInvalidExpression)
	if !strings.Contains(r.Error.Message, "position 4") {
		t.Errorf("message %q has no position", r.Error.Message)
	}
	if string(r.Error.Details) != `{"position":4}` {
		t.Errorf("details = %s, want the position", r.Error.Details)
	}
	check(t, ex.Execute(ctx, call("calculator", `{"expression":"sqrt(-4)"}`), principal),
		toolbus.StatusFailed, packs.CodeInvalidExpression)

	// The input schema is enforced before the tool runs.
	for _, args := range []string{`{}`, `{"expression":2}`, `{"expression":"1","extra":true}`, `not json`} {
		check(t, ex.Execute(ctx, call("calculator", args), principal), toolbus.StatusRejected, toolbus.CodeInvalidArguments)
	}
}

func TestLookupIncidentTool(t *testing.T) {
	ex := newExecutor(t, "demo")
	ctx := context.Background()

	r := check(t, ex.Execute(ctx, call("lookup_incident", `{"incident_id":"INC-001"}`), principal),
		toolbus.StatusSucceeded, "")
	in := output[packs.Incident](t, r)
	if in.IncidentID != "INC-001" || in.Service != "auth-api" || in.Severity != "high" ||
		in.Summary != "database connection pool exhausted" || len(in.Evidence) != 3 || in.Status == "" {
		t.Errorf("INC-001 = %+v", in)
	}
	for _, id := range []string{"INC-002", "INC-003"} {
		r := check(t, ex.Execute(ctx, call("lookup_incident", `{"incident_id":"`+id+`"}`), principal),
			toolbus.StatusSucceeded, "")
		if in := output[packs.Incident](t, r); in.IncidentID != id || in.Service == "" || len(in.Evidence) == 0 {
			t.Errorf("%s = %+v", id, in)
		}
	}

	r = check(t, ex.Execute(ctx, call("lookup_incident", `{"incident_id":"INC-404"}`), principal),
		toolbus.StatusFailed, packs.CodeIncidentNotFound)
	if !strings.Contains(r.Error.Message, "INC-404") || r.Error.Retryable {
		t.Errorf("INC-404 error = %+v", r.Error)
	}

	for _, args := range []string{`{"incident_id":"inc-1"}`, `{"incident_id":"INC-"}`, `{}`, `{"incident_id":"INC-1","x":1}`} {
		check(t, ex.Execute(ctx, call("lookup_incident", args), principal), toolbus.StatusRejected, toolbus.CodeInvalidArguments)
	}
}

func TestLookupIncidentDirect(t *testing.T) {
	in, err := packs.LookupIncident("INC-001")
	if err != nil {
		t.Fatal(err)
	}
	in.Evidence[0] = "changed"
	again, _ := packs.LookupIncident("INC-001")
	if again.Evidence[0] == "changed" {
		t.Fatal("LookupIncident returns the fixture's own slice")
	}
	var xe *executor.Error
	if _, err := packs.LookupIncident("nope"); !errors.As(err, &xe) || xe.Code != toolbus.CodeInvalidArguments {
		t.Fatalf("LookupIncident(nope) = %v", err)
	}
}

func TestSleepTool(t *testing.T) {
	ex := newExecutor(t, "diag")

	r := check(t, ex.Execute(context.Background(), call("sleep", `{"ms":20}`), principal), toolbus.StatusSucceeded, "")
	if got := output[map[string]int](t, r); got["slept_ms"] != 20 {
		t.Errorf("output = %s", r.Output)
	}
	check(t, ex.Execute(context.Background(), call("sleep", `{"ms":0}`), principal), toolbus.StatusSucceeded, "")

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	// A sleep of a minute that ends cancelled was ended by the cancel, not by its length.
	r = ex.Execute(ctx, call("sleep", `{"ms":60000}`), principal)
	check(t, r, toolbus.StatusCancelled, toolbus.CodeCancelled)

	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	check(t, ex.Execute(ctx, call("sleep", `{"ms":60000}`), principal), toolbus.StatusTimedOut, toolbus.CodeTimeout)

	for _, args := range []string{`{"ms":-1}`, `{"ms":600001}`, `{"ms":1.5}`, `{"ms":"1"}`, `{}`} {
		check(t, ex.Execute(context.Background(), call("sleep", args), principal), toolbus.StatusRejected, toolbus.CodeInvalidArguments)
	}
}

func TestFailTool(t *testing.T) {
	ex := newExecutor(t, "diag")
	ctx := context.Background()

	r := check(t, ex.Execute(ctx, call("fail", `{}`), principal), toolbus.StatusFailed, toolbus.CodeToolError)
	if r.Error.Retryable {
		t.Error("default fail is retryable")
	}
	r = check(t, ex.Execute(ctx, call("fail", `{"code":"upstream_down","retryable":true,"message":"try later"}`), principal),
		toolbus.StatusFailed, "upstream_down")
	if !r.Error.Retryable || !strings.Contains(r.Error.Message, "try later") {
		t.Errorf("error = %+v", r.Error)
	}
	r = check(t, ex.Execute(ctx, call("fail", `{"code":"quota","retryable":false}`), principal), toolbus.StatusFailed, "quota")
	if r.Error.Retryable {
		t.Errorf("error = %+v", r.Error)
	}
}

func TestPanicTool(t *testing.T) {
	ex := newExecutor(t, "diag")
	check(t, ex.Execute(context.Background(), call("panic", `{"message":"boom"}`), principal),
		toolbus.StatusFailed, toolbus.CodeToolInternalError)
	check(t, ex.Execute(context.Background(), call("panic", `{}`), principal),
		toolbus.StatusFailed, toolbus.CodeToolInternalError)
}

func TestBadOutputTool(t *testing.T) {
	ex := newExecutor(t, "diag")
	check(t, ex.Execute(context.Background(), call("bad_output", `{}`), principal),
		toolbus.StatusFailed, toolbus.CodeInvalidToolOutput)
}

func TestBigOutputTool(t *testing.T) {
	ex := newExecutor(t, "diag")
	const size = 10 << 20
	r := check(t, ex.Execute(context.Background(), call("big_output", `{"bytes":10485760}`), principal),
		toolbus.StatusSucceeded, "")
	if r.Truncated == nil {
		t.Fatalf("10 MiB output not truncated: content %d bytes", len(r.Content))
	}
	if r.Truncated.OriginalBytes < size || r.Truncated.KeptBytes >= size || len(r.Content) >= size {
		t.Errorf("truncation = %+v, content %d bytes", *r.Truncated, len(r.Content))
	}

	r = check(t, ex.Execute(context.Background(), call("big_output", `{"bytes":100}`), principal),
		toolbus.StatusSucceeded, "")
	if r.Truncated != nil || !strings.Contains(r.Content, "xxxx") {
		t.Errorf("small output: %+v", r)
	}
	check(t, ex.Execute(context.Background(), call("big_output", `{"bytes":67108865}`), principal),
		toolbus.StatusRejected, toolbus.CodeInvalidArguments)
}

func TestBigOutput(t *testing.T) {
	for _, n := range []int{0, 5, 10, 11, 12, 13, 100, 1000, 1 << 20, 1<<20 + 7} {
		b := packs.BigOutput(n)
		if want := max(n, 11); len(b) != want {
			t.Errorf("BigOutput(%d) has %d bytes, want %d", n, len(b), want)
		}
		var v struct{ Data string }
		if err := json.Unmarshal(b, &v); err != nil || strings.Trim(v.Data, "x") != "" {
			t.Errorf("BigOutput(%d) = %.40s...: %v", n, b, err)
		}
	}
}

func TestNoopTool(t *testing.T) {
	ex := newExecutor(t, "diag")
	for _, args := range []string{`{}`, `{"x":"anything"}`} {
		r := check(t, ex.Execute(context.Background(), call("noop", args), principal), toolbus.StatusSucceeded, "")
		if string(r.Output) != "{}" {
			t.Errorf("noop output = %q", r.Output)
		}
	}
	check(t, ex.Execute(context.Background(), call("noop", `{"y":1}`), principal), toolbus.StatusRejected, toolbus.CodeInvalidArguments)
}

func TestCounterTool(t *testing.T) {
	packs.ResetCounters()
	t.Cleanup(packs.ResetCounters)
	ex := newExecutor(t, "diag")

	var keys []string
	for i := range 3 {
		c := toolbus.ToolCall{CallID: "counter-" + string(rune('a'+i)), Tool: "counter", Arguments: `{"key":"k1"}`}
		r := check(t, ex.Execute(context.Background(), c, principal), toolbus.StatusSucceeded, "")
		out := output[packs.CounterOutput](t, r)
		if out.Key == "" || out.Count < 1 {
			t.Fatalf("counter output = %s", r.Output)
		}
		if got := packs.CounterValue(out.Key); got != out.Count {
			t.Errorf("CounterValue(%q) = %d, output says %d", out.Key, got, out.Count)
		}
		keys = append(keys, out.Key)
	}
	if got := packs.TotalCounter(); got != 3 {
		t.Errorf("TotalCounter() = %d, want 3", got)
	}
	var sum int64
	for _, k := range slices.Compact(slices.Sorted(slices.Values(keys))) {
		sum += packs.CounterValue(k)
	}
	if sum != 3 {
		t.Errorf("counts over keys %v sum to %d, want 3", keys, sum)
	}

	packs.ResetCounters()
	if packs.TotalCounter() != 0 || packs.CounterValue(keys[0]) != 0 {
		t.Error("ResetCounters did not reset")
	}

	// The idempotency key of the call, when there is one, names the counter.
	ctx := executor.WithCallInfo(context.Background(),
		executor.CallInfo{RunID: "run1", Step: 2, CallIndex: 0, Attempt: 1, IdempotencyKey: "run1/2/0"})
	for i := int64(1); i <= 2; i++ {
		r := check(t, ex.Execute(ctx, call("counter", `{"key":"ignored"}`), principal), toolbus.StatusSucceeded, "")
		if out := output[packs.CounterOutput](t, r); out.Key != "run1/2/0" || out.Count != i {
			t.Errorf("counter with an idempotency key: output %s", r.Output)
		}
	}
	// Without one, the key argument does, and "default" without both.
	check(t, ex.Execute(context.Background(), call("counter", `{"key":"k2"}`), principal), toolbus.StatusSucceeded, "")
	check(t, ex.Execute(context.Background(), call("counter", `{}`), principal), toolbus.StatusSucceeded, "")
	if packs.CounterValue("run1/2/0") != 2 || packs.CounterValue("k2") != 1 || packs.CounterValue("default") != 1 ||
		packs.CounterValue("ignored") != 0 || packs.TotalCounter() != 4 {
		t.Errorf("counts: idem %d, k2 %d, default %d, ignored %d, total %d", packs.CounterValue("run1/2/0"),
			packs.CounterValue("k2"), packs.CounterValue("default"), packs.CounterValue("ignored"), packs.TotalCounter())
	}
}

func TestConcurrentCalls(t *testing.T) {
	packs.ResetCounters()
	t.Cleanup(packs.ResetCounters)
	ex := newExecutor(t, "demo", "diag")
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			ctx := context.Background()
			tools := []toolbus.ToolCall{
				call("calculator", `{"expression":"2^10 + 1"}`),
				call("lookup_incident", `{"incident_id":"INC-002"}`),
				call("noop", `{}`),
				{CallID: "conc-" + string(rune('A'+i)), Tool: "counter", Arguments: `{"key":"conc"}`},
			}
			for _, c := range tools {
				if r := ex.Execute(ctx, c, principal); r.Status != toolbus.StatusSucceeded {
					t.Errorf("%s: %+v", c.Tool, r)
				}
			}
		})
	}
	wg.Wait()
	if got := packs.TotalCounter(); got != 32 {
		t.Errorf("TotalCounter() = %d, want 32", got)
	}
}

func BenchmarkNoop(b *testing.B) {
	ex := newExecutor(b, "diag")
	c := call("noop", `{}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if r := ex.Execute(ctx, c, principal); r.Status != toolbus.StatusSucceeded {
			b.Fatal(r)
		}
	}
}

func BenchmarkCalculate(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := packs.Calculate("(2+3)*sqrt(16)^2 - max(1, 7, 3) / 2.5e1 % 7"); err != nil {
			b.Fatal(err)
		}
	}
}

// restart_service needs approval; when the executor runs it (approved), it reports the
// call's idempotency key.
func TestRestartService(t *testing.T) {
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo"); err != nil {
		t.Fatal(err)
	}
	tool, ok := reg.Lookup("restart_service")
	if !ok || !tool.NeedsApproval || tool.ReadOnly {
		t.Fatalf("restart_service: %+v", tool.Contract())
	}
	ex := testutil.Must(executor.New(reg))
	ctx := executor.WithCallInfo(context.Background(), executor.CallInfo{IdempotencyKey: "r/0/c1"})
	res := ex.Execute(ctx, toolbus.ToolCall{CallID: "c1", Tool: "restart_service", Arguments: `{"service":"auth-api"}`}, toolbus.Principal{})
	if res.Status != toolbus.StatusSucceeded || !strings.Contains(res.Content, `"idempotency_key":"r/0/c1"`) {
		t.Fatalf("result %+v", res)
	}
	res = ex.Execute(ctx, toolbus.ToolCall{CallID: "c2", Tool: "restart_service", Arguments: `{"service":"Auth API"}`}, toolbus.Principal{})
	if res.Status != toolbus.StatusRejected || res.Code() != toolbus.CodeInvalidArguments {
		t.Fatalf("bad service name: %+v", res)
	}
}
