package otlp_test

import (
	"testing"

	"github.com/toolbus/toolbus/telemetry"
	_ "github.com/toolbus/toolbus/telemetry/otlp"
)

// Importing the package registers the exporters: SetupTracing then exports (the
// exporter connects lazily, so no collector is needed to set it up).
func TestImportRegistersTheExporters(t *testing.T) {
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
		shutdown, err := telemetry.SetupTracing(t.Context(), "t")
		if err != nil {
			t.Fatalf("%s: %v", proto, err)
		}
		_ = shutdown(t.Context()) // nothing was exported; the flush may find no collector
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "smoke-signals")
	if _, err := telemetry.SetupTracing(t.Context(), "t"); err == nil {
		t.Fatal("an unknown OTLP protocol was accepted")
	}
}
