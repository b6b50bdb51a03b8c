//go:build toolbus_lite

package models

import (
	"fmt"
	"log/slog"

	"github.com/toolbus/toolbus/planner"
)

// providerModel refuses: a toolbus_lite build (make demo) links no provider SDK, so it
// builds in a fraction of the time; scripts, script files and cassettes still work.
func providerModel(kind, _, _, _ string, _ *slog.Logger) (planner.Model, error) {
	return nil, fmt.Errorf("this toolbus was built with -tags toolbus_lite (make demo), without the provider SDKs: %s: models need the full binary (make build, or go build ./cmd/toolbus)", kind)
}
