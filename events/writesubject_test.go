package events_test

import (
	"testing"

	"github.com/toolbus/toolbus/events"
)

// A write names one literal subject: the write service (package intake) takes none with
// an empty or a wildcard token, which a tenant's import of a pattern would deliver and a
// stream would store as a message of no run or a key of no call.
func TestParseWriteSubjectIsLiteral(t *testing.T) {
	for _, c := range []struct {
		s  string
		ok bool
	}{
		{"toolbus_write.team.alpha.toolbus.r1.tool.finished.calc", true},
		{"toolbus_write.client.alice.toolbus.r1.run.started.alice", true},
		{"toolbus_write.team.alpha.$KV.toolbus_claims.calc.r1.0.c1", true},
		{"toolbus_write.team.alpha.toolbus.*.tool.finished.calc", false},
		{"toolbus_write.team.alpha.toolbus.>.tool.finished.calc", false},
		{"toolbus_write.team.alpha.$KV.toolbus_claims.calc.>", false},
		{"toolbus_write.client.alice.toolbus.*.run.started.alice", false},
		{"toolbus_write.team.*.toolbus.r1.tool.finished.calc", false},
		{"toolbus_write.team.alpha.toolbus..tool.finished.calc", false},
		{"toolbus_write.team.alpha.toolbus.r1.tool.finished.", false},
		{"toolbus_write.other.alpha.toolbus.r1.tool.finished.calc", false},
	} {
		if _, _, _, ok := events.ParseWriteSubject(c.s); ok != c.ok {
			t.Errorf("ParseWriteSubject(%q) ok = %v, want %v", c.s, ok, c.ok)
		}
	}
}
