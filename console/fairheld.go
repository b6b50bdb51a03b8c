package console

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/fair"
)

// fairAskTimeout bounds one question to the fair scheduler: with fair share off nobody
// answers (no responders, at once); credentials that may not ask time out.
const fairAskTimeout = 300 * time.Millisecond

// fairHolds asks the fair scheduler, once per tool and principal for one page, whether
// it still holds a requested call: a call it holds has not reached an executor, and is
// shown as queued with its place in line, not as running.
type fairHolds struct {
	bus  *events.Bus
	seen map[[2]string][]fair.Held
}

func newFairHolds(bus *events.Bus) *fairHolds {
	return &fairHolds{bus: bus, seen: map[[2]string][]fair.Held{}}
}

// queued says why the scheduler holds the call (tool, run, step, call id) of principal,
// "" when it does not hold it (or no scheduler answers). It asks only of principal's
// calls (events.FairHeldForSubject): what a client's credentials may ask too.
func (f *fairHolds) queued(ctx context.Context, principal, tool, run string, step int, callID string) string {
	k := [2]string{tool, principal}
	held, ok := f.seen[k]
	if !ok {
		ctx, cancel := context.WithTimeout(ctx, fairAskTimeout)
		defer cancel()
		if msg, err := f.bus.Conn().RequestWithContext(ctx, events.FairHeldForSubject(tool, principal), nil); err == nil {
			_ = json.Unmarshal(msg.Data, &held) // an answer not understood holds nothing
		}
		f.seen[k] = held
	}
	key := store.ClaimKey(events.ToolToken(tool), run, step, callID)
	for _, h := range held {
		if pos := h.Position(key); pos > 0 {
			return fmt.Sprintf("queued, %d of %d in line; %s", pos, h.Queued, h.Reason(tool))
		}
	}
	return ""
}
