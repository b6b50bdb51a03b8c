// Package packs holds the built-in tool packs of toolbus, ready to add to an
// executor.Registry:
//
//   - "demo": calculator (a hand-written arithmetic parser) and lookup_incident (over a
//     bundled fixture of incidents INC-001 to INC-003).
//   - "diag": tools for tests and benchmarks: sleep, fail, panic, big_output, bad_output,
//     noop and counter (a side effect whose runs can be counted with CounterValue).
package packs

import (
	"errors"
	"fmt"
	"slices"

	"github.com/toolbus/toolbus/executor"
)

// ErrUnknownPack is wrapped by the error Register returns for a pack name it does not know.
var ErrUnknownPack = errors.New("unknown tool pack")

var packs = map[string]func(*executor.Registry) error{
	"demo": registerDemo,
	"diag": registerDiag,
}

// Names returns the names of the available packs, sorted.
func Names() []string {
	names := make([]string, 0, len(packs))
	for name := range packs {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Register adds the tools of the named packs to r, in order. Every name is checked
// before any tool is added: an unknown name returns an error wrapping ErrUnknownPack and
// adds nothing. Registering a tool r already has (for example the same pack twice)
// returns the registry's error, wrapped. No names adds nothing.
func Register(r *executor.Registry, names ...string) error {
	for _, name := range names {
		if _, ok := packs[name]; !ok {
			return fmt.Errorf("packs: %w %q (available: %v)", ErrUnknownPack, name, Names())
		}
	}
	for _, name := range names {
		if err := packs[name](r); err != nil {
			return fmt.Errorf("packs: registering pack %q: %w", name, err)
		}
	}
	return nil
}
