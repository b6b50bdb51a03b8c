// Command client is toolbus's side of the official MCP conformance suite's client
// scenarios (`conformance client --command`): the suite starts a scenario's server and
// runs this program with the server's URL as the last argument, the scenario's name in
// MCP_CONFORMANCE_SCENARIO and its credentials in MCP_CONFORMANCE_CONTEXT (JSON:
// client_id, client_secret, private_key_pem, signing_algorithm).
//
// The program maps them to one server of an executor's MCP configuration (the "oauth"
// object of TOOLBUS_MCP_CONFIG), connects it with the code executors use
// (mcptools.Provider, mcpauth) and calls every tool it serves through an
// executor.Executor, with arguments made from each tool's input schema. It exits 1 when
// the server cannot be connected or a call does not succeed. The scenarios' authorization
// server redirects at once, so the authorization-code grant's fetcher follows that
// redirect instead of sending a person to a browser.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
)

// ClientMetadataURL is the Client ID Metadata Document URL the suite's auth/basic-cimd
// scenario expects as the client id.
const ClientMetadataURL = "https://conformance-test.local/client-metadata.json"

// scenarioContext is MCP_CONFORMANCE_CONTEXT.
type scenarioContext struct {
	ClientID         string `json:"client_id"`
	ClientSecret     string `json:"client_secret"`
	PrivateKeyPEM    string `json:"private_key_pem"`
	SigningAlgorithm string `json:"signing_algorithm"`
}

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "conformance client:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: client URL (the suite gives the scenario's server URL last)")
	}
	ctx, cancel := context.WithTimeout(ctx, 25*time.Second)
	defer cancel()
	srv, err := server(args[len(args)-1], getenv("MCP_CONFORMANCE_SCENARIO"), getenv("MCP_CONFORMANCE_CONTEXT"))
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	reg := executor.NewRegistry()
	ex, err := executor.New(reg, executor.WithLogger(log))
	if err != nil {
		return err
	}
	p, err := mcptools.New(reg, mcptools.Config{MCPServers: map[string]mcptools.Server{"conformance": srv}},
		mcptools.Options{Logger: ex.Logger(), OnSecret: ex.AddSecrets, AuthorizationCodeFetcher: followRedirect})
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Close()
	for i, name := range p.Tools() {
		t, _ := reg.Lookup(name)
		call := toolbus.ToolCall{CallID: fmt.Sprintf("call-%d", i), Tool: name, Arguments: string(Arguments(t.InputSchema))}
		res := ex.Execute(ctx, call, toolbus.Principal{})
		if res.Status != toolbus.StatusSucceeded {
			b, _ := json.Marshal(res)
			return fmt.Errorf("tool %s: %s", name, b)
		}
		fmt.Printf("%s: %s\n", name, res.Output)
	}
	return nil
}

// server is the executor configuration of a scenario: its URL and, for the auth/
// scenarios, the oauth object its context calls for.
func server(u, scenario, sc string) (mcptools.Server, error) {
	s := mcptools.Server{URL: u}
	if !strings.HasPrefix(scenario, "auth/") {
		return s, nil
	}
	var c scenarioContext
	if sc != "" {
		if err := json.Unmarshal([]byte(sc), &c); err != nil {
			return s, fmt.Errorf("MCP_CONFORMANCE_CONTEXT: %w", err)
		}
	}
	o := mcpauth.Config{ClientID: c.ClientID, ClientSecret: c.ClientSecret, PrivateKey: c.PrivateKeyPEM,
		SigningAlgorithm: c.SigningAlgorithm}
	if strings.HasPrefix(scenario, "auth/client-credentials") {
		o.Grant = mcpauth.GrantClientCredentials
	} else {
		o.Grant, o.ClientMetadataURL = mcpauth.GrantAuthorizationCode, ClientMetadataURL
	}
	s.OAuth = &o
	return s, nil
}

// followRedirect is the authorization-code fetcher of the scenarios: their authorization
// server redirects to the redirect URL with the code at once, so the code is read from
// that redirect's Location.
func followRedirect(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args.URL, nil)
	if err != nil {
		return nil, err
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Query().Get("code") == "" {
		return nil, fmt.Errorf("the authorization server answered %s without a code in a redirect", resp.Status)
	}
	q := loc.Query()
	return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
}

// Arguments are a tool call's arguments made from its input schema: each property a
// value of its type (numbers 1, strings "test", booleans true, arrays and objects empty).
func Arguments(schema json.RawMessage) json.RawMessage {
	var s struct {
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
	}
	_ = json.Unmarshal(schema, &s)
	args := map[string]any{}
	for name, p := range s.Properties {
		t, _ := p.Type.(string)
		if ts, ok := p.Type.([]any); ok && len(ts) > 0 {
			t, _ = ts[0].(string)
		}
		args[name] = map[string]any{"number": 1, "integer": 1, "boolean": true, "array": []any{}, "object": map[string]any{}}[t]
		if t == "string" || args[name] == nil {
			args[name] = "test"
		}
	}
	b, _ := json.Marshal(args)
	return b
}
