//go:build !toolbus_lite

package main

// The full build exports traces over OTLP; make demo's lite build links no exporter.
import _ "github.com/toolbus/toolbus/telemetry/otlp"
