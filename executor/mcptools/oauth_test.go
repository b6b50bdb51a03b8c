package mcptools_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/executor/mcptools"
)

// TestOAuthConfigLoad: an oauth object loads with its "${NAME}" values read from the
// environment; one on a stdio server, an unset variable or an incomplete grant is refused
// at load with ErrConfig, naming the server.
func TestOAuthConfigLoad(t *testing.T) {
	t.Setenv("MCP_TEST_CLIENT_SECRET", "from-the-environment")
	for _, c := range []struct{ name, json, bad string }{
		{"client credentials", `{"mcpServers":{"s":{"url":"https://x.example/mcp","oauth":{"grant":"client_credentials","clientId":"a","clientSecret":"${MCP_TEST_CLIENT_SECRET}"}}}}`, ""},
		{"on a stdio server", `{"mcpServers":{"s":{"command":"true","oauth":{"grant":"client_credentials","clientId":"a","clientSecret":"x"}}}}`, "not a command"},
		{"unset variable", `{"mcpServers":{"s":{"url":"https://x.example/mcp","oauth":{"grant":"client_credentials","clientId":"a","clientSecret":"${MCP_TEST_UNSET_VARIABLE}"}}}}`, "MCP_TEST_UNSET_VARIABLE is not set"},
		{"no credential", `{"mcpServers":{"s":{"url":"https://x.example/mcp","oauth":{"grant":"client_credentials","clientId":"a"}}}}`, "clientSecret or privateKey"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "mcp.json")
			if err := os.WriteFile(path, []byte(c.json), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := mcptools.LoadConfig(path)
			if c.bad == "" {
				if err != nil || cfg.MCPServers["s"].OAuth.ClientSecret != "from-the-environment" {
					t.Fatalf("LoadConfig = %+v, %v", cfg.MCPServers["s"].OAuth, err)
				}
				return
			}
			if err == nil || !errors.Is(err, mcptools.ErrConfig) || !strings.Contains(err.Error(), c.bad) || !strings.Contains(err.Error(), `"s"`) {
				t.Fatalf("LoadConfig: %v, want an ErrConfig naming server \"s\" and %q", err, c.bad)
			}
		})
	}
}
