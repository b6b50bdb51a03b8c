package events_test

import (
	"strings"
	"testing"

	"github.com/toolbus/toolbus/events"
)

// Each refused subject is explained by the grant it needs.
func TestGrantHint(t *testing.T) {
	cases := []struct {
		op, subject, want string
	}{
		{"publish", "$KV.toolbus_instances.alpha.e-1.b00t", `instance records of team "alpha"`},
		{"publish", "$KV.toolbus_instances.e-1.b00t", "TOOLBUS_TEAM"},
		{"publish", "$KV.toolbus_tools.calculator", `tool "calculator" is not granted`},
		{"publish", "$KV.toolbus_claims.calculator.r1.0.c1", `tool "calculator" is not granted`},
		{"publish", "$KV.toolbus_outputs.web_search.r1.0.c1.meta", `tool "web_search" is not granted`},
		{"publish", "$KV.toolbus_runs.r1", "written by other roles"},
		{"publish", "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS_QUEUES.tool_refund", `the queue of tool "refund"`},
		{"publish", "$JS.API.CONSUMER.MSG.NEXT.TOOLBUS.planner", `"planner" is another role's`},
		{"publish", "$JS.API.STREAM.CREATE.TOOLBUS", "only the admin's credentials"},
		{"publish", "$JS.API.CONSUMER.DURABLE.CREATE.TOOLBUS.x", "only the admin's credentials"},
		{"publish", "toolbus.r1.run.started.bob", `start runs for principal "bob"`},
		{"publish", "toolbus.r1.approval.granted.bob", `decide as "bob"`},
		{"publish", "toolbus.r1.run.cancel.bob", `cancel as "bob"`},
		{"publish", "toolbus.r1.tool.finished.refund", `tool "refund" is not granted`},
		{"publish", "toolbus.r1.model.requested", "another role's to publish"},
		{"subscribe", "toolbus.>", "role's permissions"},
		{"publish", "anything.else", "role's permissions"},
	}
	for _, tc := range cases {
		if got := events.GrantHint(tc.op, tc.subject); !strings.Contains(got, tc.want) {
			t.Errorf("GrantHint(%s %s) = %q, want it to contain %q", tc.op, tc.subject, got, tc.want)
		}
	}
}
