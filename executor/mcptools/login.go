package mcptools

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
)

// LoginCommand is `toolbus mcp-login SERVER`: the one-time operator login of the
// server SERVER of the configuration file at path (TOOLBUS_MCP_CONFIG), whose oauth
// grant is authorization_code (mcpauth.Login). It prints the URL to open to out and
// returns once the tokens are in the server's tokenFile.
func LoginCommand(ctx context.Context, path string, args []string, out io.Writer) error {
	const usage = "usage: toolbus mcp-login SERVER   (log in once to a server of TOOLBUS_MCP_CONFIG whose oauth grant is authorization_code)"
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		fmt.Fprintln(out, usage)
		return nil
	}
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("mcp-login: %s", usage)
	}
	if path == "" {
		return fmt.Errorf("mcp-login: TOOLBUS_MCP_CONFIG is not set")
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		return err
	}
	s, ok := cfg.MCPServers[args[0]]
	if !ok {
		return fmt.Errorf("mcp-login: %s has no server %q (it has %s)", path, args[0], strings.Join(slices.Sorted(maps.Keys(cfg.MCPServers)), ", "))
	}
	if s.OAuth == nil {
		return fmt.Errorf("mcp-login: server %q has no oauth object", args[0])
	}
	return mcpauth.Login(ctx, s.URL, *s.OAuth, out)
}
