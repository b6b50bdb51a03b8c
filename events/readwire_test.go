package events_test

import (
	"testing"

	"github.com/toolbus/toolbus/events"
)

// ReadIdentity reads back the identity of ReadAPIPrefix and nothing else.
func TestReadIdentity(t *testing.T) {
	for _, tc := range []struct{ prefix, want string }{
		{events.ReadAPIPrefix("alice"), "alice"},
		{events.ReadAPIPrefix("svc_bot-2"), "svc_bot-2"},
		{"toolbus_read.alice", ""},
		{"toolbus_read.a.b.API", ""},
		{"JS.core.API", ""},
		{"toolbus_read..API", ""},
		{"", ""},
	} {
		if got := events.ReadIdentity(tc.prefix); got != tc.want {
			t.Errorf("ReadIdentity(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
}
