package node

import (
	"errors"
	"testing"
)

// A role's error names the role once, and keeps its cause.
func TestRoleError(t *testing.T) {
	base := errors.New("replay: no cassette")
	if got := roleError("planner", base).Error(); got != "planner: replay: no cassette" {
		t.Errorf("roleError = %q", got)
	}
	if got := roleError("planner", roleError("planner", base)).Error(); got != "planner: replay: no cassette" {
		t.Errorf("roleError twice = %q", got)
	}
	if !errors.Is(roleError("planner", base), base) {
		t.Error("roleError lost the cause")
	}
}
