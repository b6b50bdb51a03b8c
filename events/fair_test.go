package events_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
)

// A call the fair scheduler released names its subject in its own header (the server
// refuses a published Nats-Stream-Source); the server's source header, when there is
// one, still wins.
func TestCallSubjectOfAReleasedCall(t *testing.T) {
	published := "toolbus.r1.tool.requested.lookup"
	h := nats.Header{}
	h.Set(events.FairCallSubjectHeader, published)
	if got := events.CallSubject(events.SubjectQueue("lookup"), h); got != published {
		t.Fatalf("released call: %q, want %q", got, published)
	}
	h.Set(events.StreamSourceHeader, "TOOLBUS 42 toolbus.*.tool.requested.* toolbus_queue.{{wildcard(2)}} toolbus.r2.tool.requested.lookup")
	if got := events.CallSubject(events.SubjectQueue("lookup"), h); got != "toolbus.r2.tool.requested.lookup" {
		t.Fatalf("with the server's header: %q, want the server's subject", got)
	}
	if got := events.CallSubject(events.SubjectQueue("lookup"), nats.Header{}); got != "" {
		t.Fatalf("no header: %q, want none", got)
	}
}
