package events_test

import (
	"strings"
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

// The held view's token of a tool keeps every name apart and is a safe subject token:
// a valid name as it is, any other (a dot, a space, a '%', nothing, too long) encoded,
// never another name's token nor UnknownToolToken, the queue they all share.
func TestFairHeldTokenKeepsNamesApart(t *testing.T) {
	long := strings.Repeat("x.", 100)
	names := []string{"gate", "a.b", "a_b", "a%2Eb", "%a%2Eb", "a b", "", "*", ">", "a.b.", ".a.b", "é", long, long + "y", events.UnknownToolToken}
	seen := map[string]string{}
	for _, n := range names {
		tok := events.FairHeldToken(n)
		if prev, ok := seen[tok]; ok {
			t.Fatalf("%q and %q share the token %q", prev, n, tok)
		}
		seen[tok] = n
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") || len(tok) > 3*128+1 {
			t.Fatalf("%q: token %q is no safe subject token", n, tok)
		}
		if n != events.UnknownToolToken && tok == events.UnknownToolToken {
			t.Fatalf("%q: token is the unknown tools' queue", n)
		}
	}
	if got := events.FairHeldSubject("gate"); got != events.FairHeldPrefix+".gate" {
		t.Fatalf("a valid name's subject %q, want its name as the token", got)
	}
}
