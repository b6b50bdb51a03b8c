package telemetry

import (
	"context"
	"errors"
	"sync"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ExporterFunc makes the span exporter of an OTLP protocol ("grpc", "http/protobuf", or
// "" for the default), configured by the OTEL_EXPORTER_OTLP_* variables.
type ExporterFunc func(ctx context.Context, proto string) (sdktrace.SpanExporter, error)

// The OTLP exporters (and gRPC with them) are linked only by the programs that ask for
// them, as database/sql drivers are: importing package telemetry/otlp registers them.
// The toolbus binary does; an executor of your own on worker.Serve links them only if
// it imports that package, so a 20-line executor stays small.
var (
	exporterMu sync.Mutex
	exporter   ExporterFunc
)

// RegisterExporter installs f as the way SetupTracing makes its exporter (package
// telemetry/otlp calls it from init).
func RegisterExporter(f ExporterFunc) {
	exporterMu.Lock()
	defer exporterMu.Unlock()
	exporter = f
}

// ErrNoExporter is SetupTracing's error when OTEL_* asks for traces in a program that
// links no exporter.
var ErrNoExporter = errors.New(`this program links no OTLP exporter: import _ "github.com/toolbus/toolbus/telemetry/otlp" (the toolbus binary's full build does; make demo's -tags toolbus_lite does not), or unset OTEL_EXPORTER_OTLP_ENDPOINT`)

func newExporter(ctx context.Context, proto string) (sdktrace.SpanExporter, error) {
	exporterMu.Lock()
	f := exporter
	exporterMu.Unlock()
	if f == nil {
		return nil, ErrNoExporter
	}
	return f(ctx, proto)
}
