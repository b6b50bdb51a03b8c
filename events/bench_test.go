package events_test

import (
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

func benchFinished() toolbus.ToolFinished {
	return toolbus.ToolFinished{RunID: "run-1", Step: 2, CallIndex: 1, CallCount: 4, ToolResult: toolbus.ToolResult{
		CallID: "call_01", Tool: "noop", Status: toolbus.StatusSucceeded, Output: []byte(`{}`), Content: "{}",
		Attempt: 1, DurationMS: 0, Executor: "bench"}}
}

func BenchmarkEncode(b *testing.B) {
	m, tf := sampleMeta(), benchFinished()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.Encode("toolbus.run-1.tool.finished.noop", m, tf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	msg, err := events.Encode("toolbus.run-1.tool.finished.noop", sampleMeta(), benchFinished())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var tf toolbus.ToolFinished
		if _, err := events.Decode(msg, &tf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeStructured(b *testing.B) {
	msg, err := events.EncodeStructured("toolbus.run-1.tool.finished.noop", sampleMeta(), benchFinished())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var tf toolbus.ToolFinished
		if _, err := events.Decode(msg, &tf); err != nil {
			b.Fatal(err)
		}
	}
}
