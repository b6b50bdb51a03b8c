package injector

import (
	"fmt"
	"slices"
	"strings"

	"github.com/toolbus/toolbus"
)

// AnyoneDecides, as an entry of Config.Deciders, lets every identity decide on and
// cancel every run, as nil Deciders do: one party on its own bus.
const AnyoneDecides = "*"

// NotDeciderError is the refusal of a decision or cancel by an identity the decision
// policy does not name for the run. A shared bus needs it: a client's credentials bind
// the actor of its decisions to its identity, and without a policy any client could
// approve, deny, answer in the tool's place or cancel any other client's run, and the
// first decision stands.
type NotDeciderError struct {
	Who, RunID, Principal string
}

func (e *NotDeciderError) Error() string {
	who := e.Who
	if who == "" {
		who = "a decision naming no one"
	}
	return fmt.Sprintf("%s may not decide on or cancel run %s: its principal %q, the approvers its start lists and the injector's TOOLBUS_DECIDERS may", who, e.RunID, e.Principal)
}

// mayDecide applies the decision policy: who may decide on rs's calls and cancel it
// when who is its principal, one of its approvers, or one of deciders (the
// administrator's list; nil or AnyoneDecides lets everyone).
func mayDecide(deciders []string, rs toolbus.RunStarted, who string) error {
	if rs.MayDecide(deciders, who) {
		return nil
	}
	return &NotDeciderError{Who: strings.TrimSpace(who), RunID: rs.RunID, Principal: rs.Principal.ID}
}

// anyoneDecides reports whether deciders place no limit on who decides.
func anyoneDecides(deciders []string) bool {
	return deciders == nil || slices.Contains(deciders, AnyoneDecides)
}
