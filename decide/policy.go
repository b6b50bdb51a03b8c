package decide

import (
	"context"
	"fmt"

	"github.com/toolbus/toolbus/events"
)

// PolicyNote warns a person about to decide on run as who when the run does not name
// who (not its principal, not one of its approvers): on a shared server the injector
// then refuses the decision unless its TOOLBUS_DECIDERS lists who, which only the
// injector's configuration tells. "" when the run names who or cannot be read.
func PolicyNote(ctx context.Context, bus *events.Bus, run, who string) string {
	rs, err := bus.RunStarted(ctx, run)
	if err != nil || rs.NamesDecider(who) {
		return ""
	}
	return fmt.Sprintf("note: %s is neither the principal (%s) of run %s nor one of its approvers: the decision stands only where the injector's TOOLBUS_DECIDERS lists %s (or *), as it does on the embedded server; otherwise the injector refuses it and the call goes on waiting", who, rs.Principal.ID, run, who)
}
