package timeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
)

// WaitingHint says what a silent run waits for and warns when no worker consumes that
// queue (no planner, no executor of a tool). Without the right to read consumers (least
// privilege) it says what the run waits for only.
func WaitingHint(ctx context.Context, bus *events.Bus, p *Printer) string {
	what, consumers := p.WaitingFor()
	if bus.ClientAccount() {
		consumers = nil // a client account reads no consumer (the read service offers none)
	}
	// A client without the right to read consumers gets no answer: do not hold the run.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	line := "        (waiting for " + what
	for _, name := range consumers {
		if events.IsToolConsumer(name) {
			line += fairHeld(ctx, bus, strings.TrimPrefix(name, events.ToolConsumerPrefix), p.principal)
		}
		cons, err := bus.DurableHome(name).Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			line += fmt.Sprintf("; warning: queue %s does not exist, nothing serves it", name)
			continue
		}
		if err != nil {
			continue
		}
		info, err := cons.Info(ctx)
		if err != nil {
			continue
		}
		switch {
		case info.NumWaiting == 0 && info.NumAckPending == 0 && !info.PushBound:
			line += fmt.Sprintf("; warning: no worker consumes queue %s (%d message(s) pending): is one running?", name, info.NumPending)
		case info.NumRedelivered > 0:
			// A worker takes messages and fails on them: a crash loop, a store it
			// cannot reach, credentials missing a permission.
			line += fmt.Sprintf("; warning: the worker of queue %s keeps failing on %d message(s) (redelivered): its log and /readyz say why (a missing permission is named there)",
				name, info.NumRedelivered)
		}
	}
	return line + ")"
}
