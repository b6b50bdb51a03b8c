package trail

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// Usage is the synopsis of `toolbus audit`.
const Usage = "usage: toolbus audit export RUN -o FILE | toolbus audit verify FILE"

// Main is `toolbus audit export RUN -o FILE` (the run's bundle, read with the bus open
// returns; close is called when done) and `toolbus audit verify FILE` (with no bus). It
// returns the exit code: 0 done and verified, 1 a failure (Explain), 2 a usage error,
// 3 an unsigned run.
func Main(ctx context.Context, args []string, open func(context.Context) (*events.Bus, func(), error), out, errOut io.Writer) int {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	fs.SetOutput(errOut)
	file := fs.String("o", "", "the bundle to write (export)")
	// Flags may come after the arguments (export RUN -o FILE).
	var pos []string
	for rest := args; len(rest) > 0; {
		if err := fs.Parse(rest); errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(errOut, Usage)
			return 0
		} else if err != nil {
			return 2
		}
		if rest = fs.Args(); len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	switch {
	case len(pos) == 2 && pos[0] == "verify":
		return VerifyFile(pos[1], out)
	case len(pos) != 2 || pos[0] != "export" || *file == "" || !toolbus.ValidRunID(pos[1]):
		fmt.Fprintln(errOut, Usage)
		return 2
	}
	b, done, err := open(ctx)
	if err != nil {
		fmt.Fprintln(errOut, "toolbus audit:", err)
		return 1
	}
	defer done()
	if err := Export(ctx, b, pos[1], *file, out); err != nil {
		fmt.Fprintln(errOut, "toolbus audit:", err)
		return 1
	}
	return 0
}
