package executor

import (
	"regexp"
	"strings"
)

// stackRE finds the start of a Go stack trace: a goroutine header or a file:line frame.
var stackRE = regexp.MustCompile(`goroutine \d+ \[[^\]\n]*\]:|[^\s"'()]+\.go:\d+`)

// stripStack cuts a message at the first sign of a stack trace (some errors carry one in
// their text); stacks belong in logs, never in what the model reads.
func stripStack(msg string) string {
	if !strings.Contains(msg, "goroutine ") && !strings.Contains(msg, ".go:") {
		return msg
	}
	loc := stackRE.FindStringIndex(msg)
	if loc == nil {
		return msg
	}
	return strings.TrimRight(msg[:loc[0]], " \t\n:") + " [stack trace removed]"
}
