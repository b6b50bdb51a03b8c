package e2e_test

import (
	"os"
	"testing"

	"github.com/toolbus/toolbus/internal/testutil"
)

// TestMain runs four tests at a time (make test: -p 4 beside other packages): most of
// them wait on servers, acknowledgement waits and leases more than they compute, and at
// two at a time (two cores) those waits add up to the package's critical path.
func TestMain(m *testing.M) {
	testutil.RaiseParallel(4)
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}
