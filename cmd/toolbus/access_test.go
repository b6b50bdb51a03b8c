package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/internal/door"
)

// TestTokenCommand: `toolbus token` prints a token and the line that lets exactly it in.
func TestTokenCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := cmdToken([]string{"alice", "--teams", "ops, payments"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	var tok, entry string
	for _, line := range strings.Split(out.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "token: "); ok {
			tok = v
		}
		if v, ok := strings.CutPrefix(line, "entry: "); ok {
			entry = v
		}
	}
	if !strings.HasPrefix(tok, "tbk_") || strings.Contains(entry, tok) {
		t.Fatalf("token %q, entry %q: want a tbk_ token and an entry without it", tok, entry)
	}
	list, err := door.Parse(entry, "test")
	if err != nil {
		t.Fatal(err)
	}
	id, ok := list.Lookup(tok)
	if !ok || id.Name != "alice" || strings.Join(id.Teams, ",") != "ops,payments" {
		t.Fatalf("lookup = %+v, %v", id, ok)
	}
	if _, ok := list.Lookup(tok + "x"); ok {
		t.Fatal("another token got in")
	}
	if _, ok := list.Lookup(strings.Fields(entry)[1]); ok {
		t.Fatal("the hash itself got in")
	}
}

// TestDoorsRefuseToStartOpen: `mcp --http` without an access list and a console with
// neither users nor public reading refuse to start (exit 2) and say what to set.
func TestDoorsRefuseToStartOpen(t *testing.T) {
	noServerEnv(t)
	t.Setenv("TOOLBUS_NATS_URL", "nats://127.0.0.1:1")
	t.Setenv("TOOLBUS_CONSOLE_ADDR", "127.0.0.1:0")
	code, out, errOut := cli(t, "mcp", "--http", ":0")
	wantCode(t, "mcp --http without tokens", code, 2, out, errOut)
	wantContains(t, "mcp --http without tokens", errOut, "TOOLBUS_MCP_TOKENS_FILE")
	code, out, errOut = cli(t, "console")
	wantCode(t, "console without users", code, 2, out, errOut)
	wantContains(t, "console without users", errOut, "TOOLBUS_CONSOLE_USERS_FILE", "TOOLBUS_CONSOLE_PUBLIC_READ")
}
