package injector

import (
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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

// BenchmarkCallsDelivered is BenchmarkCallsHeard with the server's delivery: a
// model.responded published on one in-process connection, heard by an injector's
// subscription on another (no stream: what the subscription adds to a publish).
func BenchmarkCallsDelivered(b *testing.B) {
	ctx := eventstest.Context(b, time.Minute)
	tb := eventstest.RunJetStream(b)
	inConn, _ := tb.Connect(b)
	in := &Injector{calls: newCallCache()}
	got := make(chan struct{}, 1024)
	sub, err := inConn.Subscribe(events.SubjectModelResponded("*"), func(m *nats.Msg) {
		if mr, ok := respondedOf(m); ok {
			in.calls.heard(stepID(mr.RunID, mr.Step), mr.Message.ToolCalls)
		}
		got <- struct{}{}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := inConn.FlushWithContext(ctx); err != nil {
		b.Fatal(err)
	}
	msg, err := events.Encode(events.SubjectModelResponded("run-1"), events.Meta{ID: events.IDModelResponded("run-1", 2),
		Type: events.TypeModelResponded, Source: "/planner/p", RunID: "run-1", Step: 2}, responded("run-1", 2, 4))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	start := processCPU(b)
	for b.Loop() {
		if err := tb.Conn.PublishMsg(msg); err != nil {
			b.Fatal(err)
		}
		<-got
	}
	b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
}
