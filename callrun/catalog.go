package callrun

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// RefusedError is a request refused before anything was published (a tool no executor
// serves): the command exits ExitUsage with Msg.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return e.Msg }

// ErrNoCatalogList says why a client in an account of its own names the tools it asks
// for: it reads the catalog tool by tool (the read service answers an entry by its name,
// never the list).
var ErrNoCatalogList = errors.New("a client account reads a tool's catalog entry by its name; toolbus tools lists the tools offered")

// Contract returns the catalog entry of the tool a call names, served by an executor
// now; a *RefusedError names the tools of the catalog when none serves it. A client in
// an account of its own reads the tool's entry by its name.
func Contract(ctx context.Context, bus *events.Bus, tool string) (toolbus.ToolContract, error) {
	if bus.ClientAccount() {
		tc, err := bus.Store().Contract(ctx, tool)
		if errors.Is(err, events.ErrNotFound) {
			return tc, &RefusedError{Msg: fmt.Sprintf("unknown tool %q: no executor published it (%s)", tool, ErrNoCatalogList)}
		}
		return tc, err
	}
	cat, err := bus.Store().WatchCatalog(ctx, nil)
	if err != nil {
		return toolbus.ToolContract{}, fmt.Errorf("catalog: %w", err)
	}
	tc, ok := cat.Lookup(tool)
	if !ok {
		return tc, &RefusedError{Msg: UnknownTool(tool, cat)}
	}
	return tc, nil
}

// CheckAllowed refuses (*RefusedError) a run's allowlist naming a tool no executor ever
// published, listing the tools of the catalog; an empty catalog, before any executor
// started, refuses nothing. A client in an account of its own, which cannot list the
// catalog, reads each tool's entry by its name and refuses the names it does not find.
func CheckAllowed(ctx context.Context, bus *events.Bus, allowed []string) error {
	if len(allowed) == 0 {
		return nil
	}
	var unknown []string
	if bus.ClientAccount() {
		for _, t := range allowed {
			_, err := bus.Store().Contract(ctx, t)
			switch {
			case errors.Is(err, events.ErrNotFound):
				unknown = append(unknown, t)
			case err != nil:
				return fmt.Errorf("catalog: %w", err)
			}
		}
		if len(unknown) > 0 {
			return &RefusedError{Msg: fmt.Sprintf("--tools: no executor published %s (%s)", strings.Join(unknown, ", "), ErrNoCatalogList)}
		}
		return nil
	}
	cat, err := bus.Store().WatchCatalog(ctx, nil)
	if err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	known := ToolNames(cat)
	if len(known) == 0 {
		return nil
	}
	for _, t := range allowed {
		if _, ok := cat.Lookup(t); !ok {
			unknown = append(unknown, t)
		}
	}
	if len(unknown) > 0 {
		return &RefusedError{Msg: fmt.Sprintf("--tools: no executor serves %s; the catalog has %s", strings.Join(unknown, ", "), strings.Join(known, ", "))}
	}
	return nil
}
