package events

import (
	"context"
	"crypto/sha256"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// HeaderCarrier adapts NATS message headers to OpenTelemetry propagation. NATS headers
// are case-sensitive, and W3C trace context names them in lower case (traceparent,
// tracestate): this carrier reads and writes keys exactly as given, where
// propagation.HeaderCarrier would canonicalize them to Traceparent.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key, exact case.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key, exact case.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// InjectTrace writes the span context of ctx into h with the global propagator (a no-op
// unless tracing is configured).
func InjectTrace(ctx context.Context, h nats.Header) {
	otel.GetTextMapPropagator().Inject(ctx, HeaderCarrier(h))
}

// ExtractTrace returns ctx with the remote span context carried by h, if any.
func ExtractTrace(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, HeaderCarrier(h))
}

// RunTraceContext is the root of a run's trace: its trace id and parent span id are
// derived from the run id, so every process puts the spans of one run in one trace
// without sharing any state. When the run's origin carries a W3C traceparent (the
// CloudEvents distributed-tracing extension of its events), that one is used instead.
func RunTraceContext(run, traceparent string) trace.SpanContext {
	if traceparent != "" {
		pctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
		if sc := trace.SpanContextFromContext(pctx); sc.IsValid() {
			return sc
		}
	}
	sum := sha256.Sum256([]byte("toolbus run " + run))
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], sum[:16])
	copy(sid[:], sum[16:24])
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid,
		TraceFlags: trace.FlagsSampled, Remote: true})
}

// traceparentKey is the context key of WithTraceparent.
type traceparentKey struct{}

// WithTraceparent returns ctx carrying a W3C traceparent for StartRun: the run's
// run.started carries it (its traceparent extension), the injector passes it to the
// run's model.requested, and so every span and event of the run joins that trace
// (RunTraceContext). A traceparent that is not valid W3C trace context is dropped.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	if !ValidTraceparent(traceparent) {
		return ctx
	}
	return context.WithValue(ctx, traceparentKey{}, traceparent)
}

func traceparentOf(ctx context.Context) string {
	tp, _ := ctx.Value(traceparentKey{}).(string)
	return tp
}

// ValidTraceparent reports whether s is a valid W3C traceparent.
func ValidTraceparent(s string) bool {
	if s == "" {
		return false
	}
	pctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(pctx).IsValid()
}
