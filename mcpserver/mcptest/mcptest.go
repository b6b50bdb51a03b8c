// Package mcptest speaks raw streamable HTTP to an MCP server in tests: the checks of the
// HTTP door (tokens, Host and Origin, sessions) need requests the go-sdk client never
// sends. The MCP server's tests and the command's use it.
package mcptest

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Initialize is a raw initialize request (protocol 2025-06-18).
const Initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`

// Post posts one JSON-RPC message to a streamable HTTP endpoint, with the bearer token
// and the session when set; edit, when set, changes the request before it is sent. A
// request that fails is a test error and a response of status 0.
func Post(t testing.TB, endpoint, token, session, body string, edit func(*http.Request)) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	if edit != nil {
		edit(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return &http.Response{StatusCode: 0, Body: io.NopCloser(strings.NewReader("")), Header: http.Header{}}
	}
	return resp
}
