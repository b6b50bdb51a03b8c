package events_test

import (
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
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

// BenchmarkPublish measures the synchronous publish of a tool.finished on an embedded
// server (in-process connection): a new event (the common path, unchanged by the
// duplicate check), a true duplicate (one more direct get: the message stored under
// the id is read and compared), and an event whose id was squatted on another subject
// (the per-subject guard: a walk over the subject and a second publish).
func BenchmarkPublish(b *testing.B) {
	bus := eventstest.Setup(b, events.Config{})
	ctx := eventstest.Context(b, 10*time.Minute)
	// The squats are logged at warn: not here.
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.DiscardHandler))
	event := func(i int) events.Envelope {
		tf := benchFinished()
		tf.RunID = "bench-" + strconv.Itoa(i)
		return events.ToolFinishedEvent("/toolbus/bench/1", tf)
	}
	// raw is what a publish cost before duplicates were checked: encode, publish, ack.
	b.Run("raw", func(b *testing.B) {
		i := -1 << 30
		for b.Loop() {
			i++
			e := event(i)
			msg, err := events.Encode(e.Subject, e.Meta, e.Data)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := bus.JetStream().PublishMsg(ctx, msg, jetstream.WithMsgID(e.Meta.ID)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			if _, err := bus.PublishEvent(ctx, event(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		e := event(-1)
		if _, err := bus.PublishEvent(ctx, e); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if ack, err := bus.PublishEvent(ctx, e); err != nil || !ack.Duplicate {
				b.Fatal(err)
			}
		}
	})
	b.Run("squatted", func(b *testing.B) {
		i := 1 << 30
		for b.Loop() {
			i++
			e := event(i)
			b.StopTimer()
			msg, err := events.Encode(events.SubjectRunStarted("decoy", ""), e.Meta, e.Data)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := bus.JetStream().PublishMsg(ctx, msg, jetstream.WithMsgID(e.Meta.ID)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := bus.PublishEvent(ctx, e); err != nil {
				b.Fatal(err)
			}
		}
	})
}
