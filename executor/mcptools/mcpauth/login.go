package mcpauth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Login is an operator's one-time login to the MCP server at serverURL with the
// authorization-code grant of cfg: it listens on cfg's loopback redirect URL, prints
// the authorization URL to out for the operator to open, receives the code on the
// callback, exchanges it (PKCE, the resource parameter) and writes the tokens to
// cfg.TokenFile (mode 0600), from which the executors take and refresh them. Any token
// already in the file is replaced.
func Login(ctx context.Context, serverURL string, cfg Config, out io.Writer) error {
	if cfg.Grant != "" && cfg.Grant != GrantAuthorizationCode {
		return fmt.Errorf("%w: login is for the authorization_code grant (%s needs none)", ErrConfig, cfg.Grant)
	}
	if cfg.TokenFile == "" {
		return fmt.Errorf("%w: login needs tokenFile, where the executors read the tokens", ErrConfig)
	}
	if err := cfg.Check(); err != nil {
		return err
	}
	redirect, err := url.Parse(cfg.redirectURL())
	if err != nil {
		return fmt.Errorf("%w: redirectUrl: %v", ErrConfig, err)
	}
	if ip := net.ParseIP(redirect.Hostname()); redirect.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%w: redirectUrl %s: the login receives the callback on a loopback address only", ErrConfig, redirect)
	}
	ln, err := net.Listen("tcp", redirect.Host)
	if err != nil {
		return fmt.Errorf("mcpauth: listen for the callback on %s: %w", redirect.Host, err)
	}
	codes := make(chan *auth.AuthorizationResult, 1)
	srv := &http.Server{Handler: callback(redirect.Path, codes)}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	defer srv.Close()
	fetch := func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
		fmt.Fprintf(out, "Open this URL in a browser to authorize toolbus:\n\n  %s\n\nWaiting for the callback on %s ...\n", args.URL, redirect)
		select {
		case r := <-codes:
			return r, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := os.Remove(cfg.TokenFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("mcpauth: replace the token file: %w", err)
	}
	h, err := authorizationCode(cfg, &http.Client{Timeout: RequestTimeout}, Options{OnSecret: func(...string) {}, Fetcher: fetch})
	if err != nil {
		return err
	}
	// A session and a tool listing: the server asks for authorization at the latest
	// there (some let initialize through).
	client := mcp.NewClient(&mcp.Implementation{Name: "toolbus-login", Version: "1"}, nil)
	sess, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: serverURL, OAuthHandler: h}, nil)
	if err != nil {
		return fmt.Errorf("mcpauth: login to %s: %w", serverURL, err)
	}
	defer sess.Close()
	if _, err := sess.ListTools(ctx, nil); err != nil {
		return fmt.Errorf("mcpauth: login to %s: %w", serverURL, err)
	}
	if _, err := os.Stat(cfg.TokenFile); err != nil {
		return fmt.Errorf("mcpauth: the server granted no refresh token, so no login can be kept in %s (%v)", cfg.TokenFile, err)
	}
	fmt.Fprintf(out, "Logged in; the tokens are in %s.\n", cfg.TokenFile)
	return nil
}

// callback answers the authorization server's redirect on path and hands its code on.
func callback(path string, codes chan<- *auth.AuthorizationResult) http.Handler {
	if path == "" {
		path = "/"
	}
	mux := http.NewServeMux()
	mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if e := q.Get("error"); e != "" {
			http.Error(w, "authorization refused: "+e, http.StatusBadRequest)
			return
		}
		if q.Get("code") == "" {
			http.Error(w, "no code in the callback", http.StatusBadRequest)
			return
		}
		select {
		case codes <- &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}:
			fmt.Fprintln(w, "toolbus is authorized; you may close this window.")
		default:
			http.Error(w, "a code was already received", http.StatusConflict)
		}
	})
	return mux
}
