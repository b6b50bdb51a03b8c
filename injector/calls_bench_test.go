package injector

import (
	"syscall"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
)

// What a step's calls cost the injector: hearing them in the step's model.responded
// (decode, check, cache) against reading the recorded assistant message (a direct get
// on an in-process embedded server: the client's and the server's work). cpu-ns/op is
// the process's CPU time (user and system) per operation.

func processCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkCallsHeard(b *testing.B) {
	msg, err := events.Encode(events.SubjectModelResponded("run-1"), events.Meta{ID: events.IDModelResponded("run-1", 2),
		Type: events.TypeModelResponded, Source: "/planner/p", RunID: "run-1", Step: 2}, responded("run-1", 2, 4))
	if err != nil {
		b.Fatal(err)
	}
	c := newCallCache()
	b.ReportAllocs()
	start := processCPU(b)
	for b.Loop() {
		mr, ok := respondedOf(msg)
		if !ok {
			b.Fatal("not decoded")
		}
		c.heard(stepID(mr.RunID, mr.Step), mr.Message.ToolCalls)
	}
	b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
}

func BenchmarkCallsRead(b *testing.B) {
	ctx := eventstest.Context(b, time.Minute)
	bus := eventstest.Setup(b, events.Config{})
	if _, _, err := bus.Store().PutAssistant(ctx, responded("run-1", 2, 4)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	start := processCPU(b)
	for b.Loop() {
		if _, err := bus.Store().Assistant(ctx, "run-1", 2); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
}
