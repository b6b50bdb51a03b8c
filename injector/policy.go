package injector

import (
	"slices"

	"github.com/toolbus/toolbus"
)

// AnyoneDecides, as an entry of Config.Deciders, lets every identity decide on and
// cancel every run, as nil Deciders do: one party on its own bus.
const AnyoneDecides = toolbus.AnyoneDecides

// NotDeciderError is the refusal of a decision or cancel by an identity the decision
// policy (toolbus.RunStarted.CheckDecider) does not name for the run.
type NotDeciderError = toolbus.NotDeciderError

// anyoneDecides reports whether deciders place no limit on who decides: the injector
// then reads no run.started to check a decision.
func anyoneDecides(deciders []string) bool {
	return deciders == nil || slices.Contains(deciders, AnyoneDecides)
}
