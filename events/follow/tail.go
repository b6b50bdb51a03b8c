package follow

import (
	"context"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Nexter gives the next event of what Tail follows, waiting at most wait for it.
type Nexter interface {
	Next(ctx context.Context, wait time.Duration) (runlog.StoredEvent, bool, error)
}

// Tail follows filter: in a client account a started run is followed live through the
// read service (Run, pushed as stored), anything else, or when the core serves no
// follow, by watching the stream (runlog.Watch: direct gets, polled).
func Tail(ctx context.Context, bus *events.Bus, run, filter string, all bool) (Nexter, error) {
	if bus.ClientAccount() && run != "" {
		from := uint64(0)
		if all {
			from = 1
		}
		if f, err := Run(ctx, bus, run, from); err == nil {
			return f, nil
		}
	}
	return runlog.Watch(ctx, bus, filter, all)
}
