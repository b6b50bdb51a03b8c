package telemetry

import (
	"errors"
	"testing"
)

// A program that links no exporter (no import of telemetry/otlp) refuses OTEL_* tracing
// with the error that names the import, instead of starting without traces.
func TestSetupTracingNeedsAnExporter(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	if _, err := SetupTracing(t.Context(), "t"); !errors.Is(err, ErrNoExporter) {
		t.Fatalf("SetupTracing without an exporter: %v, want ErrNoExporter", err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	if _, err := SetupTracing(t.Context(), "t"); err != nil {
		t.Fatalf("SetupTracing with no OTEL_* asks for nothing: %v", err)
	}
}
