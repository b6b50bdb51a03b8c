// Package otlp links the OTLP trace exporters (gRPC and HTTP/protobuf) into a program
// and registers them with package telemetry: import it for its effect,
//
//	import _ "github.com/toolbus/toolbus/telemetry/otlp"
//
// to export traces when the OTEL_* variables ask for them. It is separate because the
// exporters bring gRPC, most of a small executor's binary otherwise.
package otlp

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolbus/toolbus/telemetry"
)

func init() { telemetry.RegisterExporter(New) }

// New returns the OTLP span exporter of proto (grpc, or http/protobuf when empty),
// configured by the OTEL_EXPORTER_OTLP_* variables.
func New(ctx context.Context, proto string) (sdktrace.SpanExporter, error) {
	switch proto {
	case "grpc":
		return otlptracegrpc.New(ctx)
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	}
	return nil, fmt.Errorf("OTLP protocol %q is not supported (grpc or http/protobuf)", proto)
}
