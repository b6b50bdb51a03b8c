package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/toolbus/toolbus/internal/door"
)

// Access lists (who may use the MCP HTTP server and the console) live in internal/door.

// cmdToken prints a new token for NAME and the access-list line that lets it in.
func cmdToken(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("token", "token NAME [--teams a,b]   (a new token for the MCP HTTP server or the console, and its access-list line)", stderr)
	teams := fs.String("teams", "", "teams of the principal (comma-separated)")
	// NAME may come before the flags (toolbus token alice --teams ops).
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		name = ""
	}
	if name == "" || strings.ContainsAny(name, " \t#;") || fs.NArg() > 1 {
		return &exitError{code: 2, msg: "token: want one NAME (no spaces, '#' or ';'): the principal or user the token stands for"}
	}
	var ts []string
	for _, t := range strings.Split(*teams, ",") {
		if t = strings.TrimSpace(t); t != "" {
			ts = append(ts, t)
		}
	}
	tok := door.NewToken()
	fmt.Fprintf(stdout, "token: %s\nentry: %s\n", tok, door.Entry(name, tok, ts))
	fmt.Fprintln(stderr, "Give the token to its holder (it is not stored anywhere); add the entry line to TOOLBUS_MCP_TOKENS_FILE or TOOLBUS_CONSOLE_USERS_FILE. Delete the line to revoke it.")
	return nil
}
