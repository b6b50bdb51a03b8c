package mcpauth_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/mcptools"
	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
	"github.com/toolbus/toolbus/internal/testutil"
)

// codeServer is an authorization server for the authorization-code grant with dynamic
// registration: /authorize redirects at once with a code (the person said yes), the token
// endpoint exchanges it (checking the PKCE verifier is sent) and refreshes; its access
// tokens live ttl.
type codeServer struct {
	*httptest.Server
	ttl       time.Duration
	mu        sync.Mutex
	access    map[string]bool
	refreshes int
	// strict: a refresh token works once (rotation), and the access tokens expire.
	strict    bool
	refresh   map[string]bool
	issued    map[string]time.Time
	refreshAt []time.Time
}

func newCodeServer(t *testing.T, ttl time.Duration) *codeServer {
	c := &codeServer{ttl: ttl, access: map[string]bool{}, refresh: map[string]bool{}, issued: map[string]time.Time{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"issuer": c.URL, "authorization_endpoint": c.URL + "/authorize", "token_endpoint": c.URL + "/token",
			"registration_endpoint": c.URL + "/register", "code_challenge_methods_supported": []string{"S256"},
			"token_endpoint_auth_methods_supported": []string{"none"}, "scopes_supported": []string{"tools", "offline_access"}})
	})
	mux.HandleFunc("POST /register", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		writeJSON(w, map[string]any{"client_id": "dyn-client", "token_endpoint_auth_method": "none", "redirect_uris": []string{}})
	})
	mux.HandleFunc("GET /authorize", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("code_challenge") == "" || q.Get("resource") == "" {
			http.Error(w, "PKCE and resource required", http.StatusBadRequest)
			return
		}
		http.Redirect(w, r, q.Get("redirect_uri")+"?code=the-code&state="+q.Get("state"), http.StatusFound)
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.FormValue("grant_type") == "authorization_code" && r.FormValue("code") == "the-code" && r.FormValue("code_verifier") != "":
		case r.FormValue("grant_type") == "refresh_token" && strings.HasPrefix(r.FormValue("refresh_token"), "rt-"):
			c.mu.Lock()
			used := c.strict && !c.refresh[r.FormValue("refresh_token")]
			if !used {
				c.refreshes++
				c.refreshAt = append(c.refreshAt, time.Now())
				delete(c.refresh, r.FormValue("refresh_token"))
			}
			c.mu.Unlock()
			if used {
				w.WriteHeader(http.StatusBadRequest)
				writeJSON(w, map[string]any{"error": "invalid_grant"})
				return
			}
		default:
			w.WriteHeader(http.StatusBadRequest)
			writeJSON(w, map[string]any{"error": "invalid_grant"})
			return
		}
		at, rt := "at-"+rand.Text(), "rt-"+rand.Text()
		c.mu.Lock()
		c.access[at], c.refresh[rt], c.issued[at] = true, true, time.Now()
		c.mu.Unlock()
		writeJSON(w, map[string]any{"access_token": at, "refresh_token": rt, "token_type": "Bearer",
			"expires_in": int(c.ttl.Seconds())})
	})
	c.Server = httptest.NewServer(mux)
	t.Cleanup(c.Close)
	return c
}

func (c *codeServer) valid(tok string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.access[tok] && (!c.strict || time.Since(c.issued[tok]) < c.ttl)
}

func freeLoopback(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestLoginThenExecutorRefreshes: the operator's login prints the authorization URL;
// opening it (the server says yes at once) brings the code to the loopback callback and
// the tokens into the token file, mode 0600. An executor's provider then connects with
// the stored token and no one to ask, calls a tool, and refreshes the short-lived
// access token with the stored refresh token.
func TestLoginThenExecutorRefreshes(t *testing.T) {
	as := newCodeServer(t, 30*time.Second)
	url := protectedServer(t, as.URL, as.valid)
	cfg := mcpauth.Config{RedirectURL: "http://" + freeLoopback(t) + "/callback", TokenFile: filepath.Join(t.TempDir(), "tokens.json")}
	ctx := eventstest.Context(t, time.Minute)
	login(ctx, t, url, cfg)

	reg := executor.NewRegistry()
	exec := testutil.Must(executor.New(reg))
	p, err := mcptools.New(reg, mcptools.Config{MCPServers: map[string]mcptools.Server{"s": {URL: url, OAuth: &cfg}}},
		mcptools.Options{OnSecret: exec.AddSecrets})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatalf("the executor did not connect with the stored token: %v", err)
	}
	defer p.Close()
	tool, ok := reg.Lookup("s__leak")
	if !ok {
		t.Fatalf("tools: %v", reg.Names())
	}
	out, err := tool.Func(ctx, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	as.mu.Lock()
	refreshes := as.refreshes
	as.mu.Unlock()
	if refreshes == 0 {
		t.Errorf("a token expiring within mcpauth.RefreshEarly was not refreshed (the call got %v)", out)
	}
	if b, _ := os.ReadFile(cfg.TokenFile); !strings.Contains(string(b), "rt-") {
		t.Errorf("the token file lost the refresh token: %s", b)
	}
}

// login is the operator's `toolbus mcp-login` of cfg to the server at url, the
// browser played by a GET of the printed URL; the token file is then mode 0600.
func login(ctx context.Context, t *testing.T, url string, cfg mcpauth.Config) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- mcpauth.Login(ctx, url, cfg, pw); pw.Close() }()
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		if u := strings.TrimSpace(sc.Text()); strings.HasPrefix(u, "http") {
			resp, err := http.Get(u) // the browser: follows the redirect to the callback
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), "authorized") {
				t.Fatalf("the callback answered %s: %s", resp.Status, body)
			}
			break
		}
	}
	go io.Copy(io.Discard, pr) //nolint:errcheck // the rest of the output
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(cfg.TokenFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, %v", st, err)
	}
}
