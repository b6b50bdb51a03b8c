package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// The three roles run with tracer providers of their own, as separate processes would,
// and meet only on the bus: a two-step run makes one trace, with one "chat <model>" span
// per step (token usage) and one "execute_tool <tool>" span per call, each the child of
// its step's span through the traceparent header of its tool.requested event.
func TestOneTracePerRunAcrossTheBus(t *testing.T) {
	t.Parallel()
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	script := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "fail", `{}`)),
		planner.Calls(call("c", "noop", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		resp, err := script.Complete(ctx, req)
		resp.Usage = toolbus.Usage{InputTokens: 7, OutputTokens: 2}
		resp.Model = "test-1"
		return resp, err
	}))
	provider := func() (*tracetest.InMemoryExporter, trace.Tracer) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return exp, tp.Tracer("test")
	}
	execSpans, execTracer := provider()
	planSpans, planTracer := provider()
	_, injTracer := provider()
	_ = injTracer // the injector makes no span; its provider stands for its process

	exec := must(executor.New(s.reg, executor.WithLogger(s.log), executor.WithInstance("executor-t")))
	s.start("executor-t", must(worker.New(s.bus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "executor-t", Logger: s.log, Grace: time.Second}, Tracer: execTracer})).Run)
	cat, err := s.bus.Store().WatchCatalog(s.ctx, s.log)
	if err != nil {
		t.Fatal(err)
	}
	eventstest.Eventually(t, 60*time.Second, func() error {
		for _, tool := range []string{"noop", "fail"} {
			if _, ok := cat.Lookup(tool); !ok {
				return fmt.Errorf("tool %s not in the catalog yet", tool)
			}
		}
		return nil
	})
	s.start("planner-t", must(planner.New(s.bus, s.model, cat, planner.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "planner-t", Logger: s.log, Grace: time.Second}, Tracer: planTracer})).Run)
	s.start("injector-t", must(injector.New(s.bus, injector.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "injector-t", Logger: s.log, Grace: time.Second}, Rules: s.rules})).Run)

	const run = "traced-1"
	s.submit(run, toolbus.Limits{})
	if ended := s.waitEnd(run); ended.Status != toolbus.RunCompleted {
		t.Fatalf("run ended %s/%s (%s), want completed", ended.Status, ended.Code, ended.Reason)
	}
	s.stopAll() // every span ended and exported

	chats := planSpans.GetSpans()
	tools := execSpans.GetSpans()
	if len(chats) != 3 {
		t.Fatalf("%d chat spans, want 3 (one per step): %v", len(chats), names(chats))
	}
	if len(tools) != 3 {
		t.Fatalf("%d tool spans, want 3 (one per call): %v", len(tools), names(tools))
	}
	traceID := events.RunTraceContext(run, "").TraceID()
	byStep := map[int]tracetest.SpanStub{}
	for _, c := range chats {
		if c.Name != "chat test" {
			t.Errorf("chat span named %q, want %q", c.Name, "chat test")
		}
		if c.SpanContext.TraceID() != traceID {
			t.Errorf("chat span in trace %s, want the run's %s", c.SpanContext.TraceID(), traceID)
		}
		a := attrs(c.Attributes)
		if a["gen_ai.operation.name"] != "chat" || a["gen_ai.request.model"] != "test" || a["gen_ai.response.model"] != "test-1" ||
			a["gen_ai.usage.input_tokens"] != "7" || a["gen_ai.usage.output_tokens"] != "2" {
			t.Errorf("chat span attributes %v", a)
		}
		var step int
		fmt.Sscan(a["toolbus.step"], &step)
		byStep[step] = c
	}
	wantTools := map[string]struct {
		step   int
		tool   string
		status string
		errTyp string
	}{
		"a": {0, "noop", "succeeded", ""},
		"b": {0, "fail", "failed", toolbus.CodeToolError},
		"c": {1, "noop", "succeeded", ""},
	}
	for _, sp := range tools {
		a := attrs(sp.Attributes)
		want, ok := wantTools[a["gen_ai.tool.call.id"]]
		if !ok {
			t.Errorf("tool span for unexpected call %q", a["gen_ai.tool.call.id"])
			continue
		}
		if sp.Name != "execute_tool "+want.tool || a["gen_ai.tool.name"] != want.tool || a["gen_ai.operation.name"] != "execute_tool" ||
			a["toolbus.tool.status"] != want.status || a["error.type"] != want.errTyp {
			t.Errorf("tool span %q attributes %v, want %+v", sp.Name, a, want)
		}
		parent, ok := byStep[want.step]
		if !ok {
			t.Fatalf("no chat span for step %d", want.step)
		}
		if sp.SpanContext.TraceID() != traceID || sp.Parent.SpanID() != parent.SpanContext.SpanID() || !sp.Parent.IsRemote() {
			t.Errorf("tool span of call %s: trace %s parent %s (remote %v), want trace %s parent %s (its step's chat span, across the bus)",
				a["gen_ai.tool.call.id"], sp.SpanContext.TraceID(), sp.Parent.SpanID(), sp.Parent.IsRemote(), traceID, parent.SpanContext.SpanID())
		}
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func attrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}
