package provision_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// The queue stream holds each call on its tool's exact subject, and the server's source
// header names the subject the call was published on: what an executor checks the call
// against (events.CallSubject). Nothing else of the event stream is copied, and nobody
// may publish into the queue stream.
func TestQueueStreamCopiesCalls(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, time.Minute)
	bus, _, err := provision.Setup(ctx, srv.Conn, events.Config{}, provision.WithTools([]string{"calc", "web"}, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	calls := []toolbus.ToolRequested{
		{RunID: "r1", CallCount: 2, Call: toolbus.ToolCall{CallID: "c1", Tool: "calc", Arguments: `{}`}},
		{RunID: "r1", CallIndex: 1, CallCount: 2, Call: toolbus.ToolCall{CallID: "c2", Tool: "web", Arguments: `{}`}},
		{RunID: "r2", CallCount: 1, Call: toolbus.ToolCall{CallID: "c1", Tool: "calc", Arguments: `{}`}},
	}
	for _, c := range calls {
		if _, err := bus.PublishEvent(ctx, events.ToolRequestedEvent("/test", c, true)); err != nil {
			t.Fatal(err)
		}
	}
	// Not a call: never copied.
	if _, err := bus.JetStream().Publish(ctx, events.SubjectToolFinished("r1", "calc"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"calc": {events.SubjectToolRequested("r1", "calc"), events.SubjectToolRequested("r2", "calc")},
		"web":  {events.SubjectToolRequested("r1", "web")},
	}
	for tool, subjects := range want {
		cons, err := bus.QueueStream().Consumer(ctx, events.ToolConsumer(tool))
		if err != nil {
			t.Fatal(err)
		}
		if f := cons.CachedInfo().Config.FilterSubject; f != events.SubjectQueue(tool) {
			t.Errorf("queue of %s filters %q", tool, f)
		}
		batch, err := cons.Fetch(len(subjects)+1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			if m.Subject() != events.SubjectQueue(tool) {
				t.Errorf("a call of %s stored on %s", tool, m.Subject())
			}
			got = append(got, events.CallSubject(m.Subject(), m.Headers()))
			_ = m.Ack()
		}
		if len(got) != len(subjects) || got[0] != subjects[0] || got[len(got)-1] != subjects[len(subjects)-1] {
			t.Errorf("queue of %s delivered calls published on %v, want %v", tool, got, subjects)
		}
	}
	si, err := bus.JetStream().Stream(ctx, events.QueueStreamName(events.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	if n := si.CachedInfo().State.Msgs; n != uint64(len(calls)) {
		t.Errorf("queue stream holds %d messages, want the %d calls", n, len(calls))
	}
	// No subject of its own: a publish on a queue subject reaches no stream.
	if _, err := bus.JetStream().Publish(ctx, events.SubjectQueue("calc"), []byte(`{}`), jetstream.WithExpectStream(events.QueueStreamName(events.DefaultStream))); err == nil {
		t.Error("a publish on a queue subject was stored")
	}
}

func TestCallSubject(t *testing.T) {
	hdr := func(vals ...string) nats.Header {
		h := nats.Header{}
		for _, v := range vals {
			h.Add(events.StreamSourceHeader, v)
		}
		return h
	}
	published := events.SubjectToolRequested("r1", "calc")
	for _, tc := range []struct {
		name, subject string
		hdr           nats.Header
		want          string
	}{
		{"event stream", published, nil, published},
		{"queue stream", events.SubjectQueue("calc"), hdr("TOOLBUS 7 toolbus.*.tool.requested.* toolbus_queue.{{wildcard(2)}} " + published), published},
		{"with the source's identity", events.SubjectQueue("calc"), hdr("TOOLBUS 7 > > " + published + " ident"), published},
		{"the server's header last", events.SubjectQueue("calc"), hdr("X 1 a b toolbus.forged.tool.requested.calc", "TOOLBUS 7 a b "+published), published},
		{"no header", events.SubjectQueue("calc"), nil, ""},
		{"short header", events.SubjectQueue("calc"), hdr("TOOLBUS 7"), ""},
	} {
		if got := events.CallSubject(tc.subject, tc.hdr); got != tc.want {
			t.Errorf("%s: CallSubject = %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := events.QueuePublishedOn(events.SubjectQueue("calc")); got != events.FilterToolRequestedFor("calc") {
		t.Errorf("QueuePublishedOn = %q", got)
	}
}
