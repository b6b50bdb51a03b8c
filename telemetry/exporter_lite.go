//go:build toolbus_lite

package telemetry

import (
	"context"
	"errors"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newExporter refuses: a toolbus_lite build (make demo) links no OTLP exporter (and so
// no gRPC), which halves its first build. Tracing set up by OTEL_* needs the full build.
func newExporter(context.Context, string) (sdktrace.SpanExporter, error) {
	return nil, errors.New("this build has no OTLP exporter (-tags toolbus_lite, as make demo builds): unset OTEL_EXPORTER_OTLP_ENDPOINT, or build without the tag")
}
