package events_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolbus/toolbus/events"
)

// W3C trace context travels in lower-case traceparent/tracestate headers, exactly: NATS
// headers are case-sensitive, so a canonicalizing carrier (Traceparent) would lose it
// between processes.
func TestHeaderCarrierExactCase(t *testing.T) {
	sc := events.RunTraceContext("run-1", "")
	ts, err := trace.ParseTraceState("vendor=x")
	if err != nil {
		t.Fatal(err)
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc.WithTraceState(ts))
	h := nats.Header{}
	propagation.TraceContext{}.Inject(ctx, events.HeaderCarrier(h))
	if _, ok := h["traceparent"]; !ok {
		t.Fatalf("headers %v lack an exact-case traceparent", h)
	}
	if got := h["tracestate"]; len(got) != 1 || got[0] != "vendor=x" {
		t.Fatalf("tracestate %v", got)
	}
	back := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), events.HeaderCarrier(h)))
	if back.TraceID() != sc.TraceID() || back.SpanID() != sc.SpanID() {
		t.Fatalf("extracted %v, want %v", back, sc)
	}
}

// Every process derives the same root for a run; a traceparent from the run's origin
// takes precedence.
func TestRunTraceContext(t *testing.T) {
	a, b := events.RunTraceContext("run-1", ""), events.RunTraceContext("run-1", "")
	if !a.IsValid() || a.TraceID() != b.TraceID() || a.SpanID() != b.SpanID() {
		t.Fatalf("roots differ: %v %v", a, b)
	}
	if c := events.RunTraceContext("run-2", ""); c.TraceID() == a.TraceID() {
		t.Fatal("two runs share a trace")
	}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	o := events.RunTraceContext("run-1", tp)
	if o.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || o.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("origin traceparent not used: %v", o)
	}
	if bad := events.RunTraceContext("run-1", "garbage"); bad.TraceID() != a.TraceID() {
		t.Fatal("an invalid traceparent must fall back to the run's root")
	}
}
