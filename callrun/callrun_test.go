package callrun

import (
	"testing"
	"time"

	"github.com/toolbus/toolbus"
)

// TestBuildDeadline: the run's deadline covers the tool's timeout plus Slack, an
// approval wait gets at least ApprovalTimeout, and an explicit deadline wins.
func TestBuildDeadline(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		spec Spec
		want time.Duration
	}{
		{name: "tool timeout", spec: Spec{Tool: toolbus.ToolContract{Name: "t", Timeout: 5 * time.Second}}, want: 5*time.Second + Slack},
		{name: "no timeout", spec: Spec{Tool: toolbus.ToolContract{Name: "t"}}, want: DefaultToolTimeout + Slack},
		{name: "default of the caller", spec: Spec{Tool: toolbus.ToolContract{Name: "t"}, DefaultToolTimeout: time.Second}, want: time.Second + Slack},
		{name: "approval", spec: Spec{Tool: toolbus.ToolContract{Name: "t", NeedsApproval: true}, ApprovalTimeout: time.Hour}, want: time.Hour},
		{name: "explicit", spec: Spec{Tool: toolbus.ToolContract{Name: "t", NeedsApproval: true}, ApprovalTimeout: time.Hour, Deadline: time.Minute}, want: time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.RunID, tt.spec.Arguments, tt.spec.Via = "r", "{}", "test"
			rs := Build(tt.spec, now)
			if got := rs.Limits.Deadline.Sub(now); got != tt.want {
				t.Fatalf("deadline in %v, want %v", got, tt.want)
			}
			if len(rs.Calls) != 1 || rs.Calls[0].CallID != CallID || rs.Calls[0].Tool != "t" || rs.AllowedTools[0] != "t" {
				t.Fatalf("calls %+v, allowed %v", rs.Calls, rs.AllowedTools)
			}
		})
	}
}
