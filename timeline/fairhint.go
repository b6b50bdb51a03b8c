package timeline

import (
	"context"
	"encoding/json"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/fair"
)

// fairHeld says why the fair scheduler holds the calls of tool of principal (of every
// tenant when principal is "", which only the core's credentials may ask), "" when it
// holds none or no scheduler answers (no fair share, or no right to ask).
func fairHeld(ctx context.Context, bus *events.Bus, tool, principal string) string {
	subject := events.FairHeldSubject(tool)
	if principal != "" {
		subject = events.FairHeldForSubject(tool, principal)
	}
	msg, err := bus.Conn().RequestWithContext(ctx, subject, nil)
	if err != nil {
		return ""
	}
	var held []fair.Held
	if json.Unmarshal(msg.Data, &held) != nil {
		return ""
	}
	line := ""
	for _, h := range held {
		if h.Queued > 0 && (principal == "" || h.Tenant == principal) {
			line += "; " + h.Reason(tool)
		}
	}
	return line
}
