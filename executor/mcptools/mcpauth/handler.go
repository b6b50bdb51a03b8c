package mcpauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"
)

// RefreshEarly is how long before its expiry a token is renewed (refreshed, or taken
// again for client credentials), so a call never leaves with a token about to expire.
const RefreshEarly = time.Minute

// RequestTimeout bounds each metadata, registration and token request of the default
// HTTP client: a token is also renewed where no call's deadline applies.
const RequestTimeout = 30 * time.Second

// Options tunes a Handler.
type Options struct {
	// HTTPClient makes the metadata, registration and token requests (default: a
	// client with RequestTimeout).
	HTTPClient *http.Client
	// OnSecret is given every credential as it becomes known (the configuration's
	// secrets at once, each new access and refresh token): the executor's AddSecrets, so
	// none of them ever reaches a result, a progress message or a log line.
	OnSecret func(values ...string)
	// Fetcher directs a person to the authorization URL and returns the code
	// (authorization_code). Nil: the executor cannot ask anyone, and an authorization
	// without a usable stored token fails with ErrLoginRequired.
	Fetcher auth.AuthorizationCodeFetcher
	// Tokens, when set, shares the server's tokens with the deployment's other
	// instances (an executor on a bus: its team's keys of toolbus_secrets). A token is
	// read there first and used while valid beyond RefreshEarly; when it is due one
	// instance renews it for all under a lease. Nil: each process keeps its own.
	Tokens TokenStore
	// Server is the MCP server's URL, part of the shared token's key (default: the
	// URL of the request that was refused, for client credentials).
	Server string
	// RefreshEarly is how long before its expiry a token is renewed (default
	// RefreshEarly; tests shorten it).
	RefreshEarly time.Duration
	// Logger reports a token store that fails (never a token; default slog.Default).
	Logger *slog.Logger
}

func (o Options) early() time.Duration {
	if o.RefreshEarly > 0 {
		return o.RefreshEarly
	}
	return RefreshEarly
}

func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// Handler returns the auth.OAuthHandler of cfg, for an mcp.StreamableClientTransport's
// OAuthHandler. The SDK's transport calls Authorize on a 401 or 403 and tries the
// request once more: a server that keeps refusing (a scope it will never grant) costs
// one authorization per request, never a loop.
func Handler(cfg Config, opts Options) (auth.OAuthHandler, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: RequestTimeout}
	}
	secret := opts.OnSecret
	if secret == nil {
		secret = func(...string) {}
	}
	secret(cfg.Secrets()...)
	opts.OnSecret = secret
	if cfg.Grant == GrantClientCredentials {
		return &clientCredentials{cfg: cfg, hc: hc, opts: opts, obs: func(t *oauth2.Token) { secret(t.AccessToken, t.RefreshToken) }}, nil
	}
	return authorizationCode(cfg, hc, opts)
}

// authorizationCode is the SDK's AuthorizationCodeHandler with the client identities of
// cfg, the stored token as its first token source, and every new token reported and
// stored.
func authorizationCode(cfg Config, hc *http.Client, opts Options) (auth.OAuthHandler, error) {
	secret := opts.OnSecret
	store := &tokenFile{path: cfg.TokenFile}
	if opts.Tokens != nil {
		return sharedAuthorizationCode(cfg, hc, opts, store)
	}
	save := func(oc *oauth2.Config, t *oauth2.Token) {
		secret(t.AccessToken, t.RefreshToken, oc.ClientSecret)
		store.save(oc, t)
	}
	ac := codeHandlerConfig(cfg, hc, opts.Fetcher)
	ac.NewTokenSource = func(ctx context.Context, oc *oauth2.Config, t *oauth2.Token) (oauth2.TokenSource, error) {
		save(oc, t)
		return observe(oauth2.ReuseTokenSourceWithExpiry(t, oc.TokenSource(ctx, t), opts.early()),
			func(t *oauth2.Token) { save(oc, t) }), nil
	}
	if oc, t, _, err := store.load(); err != nil {
		return nil, err
	} else if t != nil {
		secret(t.AccessToken, t.RefreshToken, oc.ClientSecret)
		ctx := context.WithValue(context.Background(), oauth2.HTTPClient, hc)
		ac.InitialTokenSource = observe(oauth2.ReuseTokenSourceWithExpiry(t, oc.TokenSource(ctx, t), opts.early()),
			func(t *oauth2.Token) { save(oc, t) })
	}
	h, err := auth.NewAuthorizationCodeHandler(ac)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return h, nil
}

// codeHandlerConfig is the SDK handler's configuration of cfg's client identities;
// the token sources are the caller's.
func codeHandlerConfig(cfg Config, hc *http.Client, fetch auth.AuthorizationCodeFetcher) *auth.AuthorizationCodeHandlerConfig {
	if fetch == nil {
		fetch = func(context.Context, *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			return nil, fmt.Errorf("%w (token file %q)", ErrLoginRequired, cfg.TokenFile)
		}
	}
	ac := &auth.AuthorizationCodeHandlerConfig{
		RedirectURL: cfg.redirectURL(), AuthorizationCodeFetcher: fetch, RequestRefreshToken: true, Client: hc,
	}
	if len(cfg.Scopes) > 0 {
		ac.ScopeFilter = func([]string) []string { return cfg.Scopes }
	}
	if cfg.ClientMetadataURL != "" {
		ac.ClientIDMetadataDocumentConfig = &auth.ClientIDMetadataDocumentConfig{URL: cfg.ClientMetadataURL}
	}
	if cfg.ClientID != "" {
		pc := &oauthex.ClientCredentials{ClientID: cfg.ClientID}
		if cfg.ClientSecret != "" {
			pc.ClientSecretAuth = &oauthex.ClientSecretAuth{ClientSecret: cfg.ClientSecret}
		}
		ac.PreregisteredClient = pc
	}
	if cfg.dynamic() {
		ac.DynamicClientRegistrationConfig = &auth.DynamicClientRegistrationConfig{Metadata: &oauthex.ClientRegistrationMetadata{
			RedirectURIs: []string{cfg.redirectURL()}, ClientName: "toolbus",
			GrantTypes: []string{"authorization_code", "refresh_token"}, ResponseTypes: []string{"code"}}}
	}
	return ac
}

// observe returns ts calling fn with each token that differs from the one before.
func observe(ts oauth2.TokenSource, fn func(*oauth2.Token)) oauth2.TokenSource {
	if fn == nil {
		return ts
	}
	return &observed{ts: ts, fn: fn}
}

type observed struct {
	ts   oauth2.TokenSource
	fn   func(*oauth2.Token)
	mu   sync.Mutex
	last string
}

func (o *observed) Token() (*oauth2.Token, error) {
	t, err := o.ts.Token()
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	fresh := t.AccessToken != o.last
	o.last = t.AccessToken
	o.mu.Unlock()
	if fresh {
		o.fn(t)
	}
	return t, nil
}

// tokenFile keeps the authorization-code grant's tokens and what refreshing them needs
// (client id and secret, token endpoint). A file of mode 0600: only the executors'
// user reads it. Without a path nothing is kept.
type tokenFile struct {
	path string
	mu   sync.Mutex
}

type storedToken struct {
	ClientID     string        `json:"client_id"`
	ClientSecret string        `json:"client_secret,omitempty"`
	TokenURL     string        `json:"token_url"`
	AuthStyle    int           `json:"auth_style,omitempty"`
	Token        *oauth2.Token `json:"token,omitempty"`
}

// load returns the file's client and token and when it was written (nil, nil: no file).
func (f *tokenFile) load() (*oauth2.Config, *oauth2.Token, time.Time, error) {
	if f.path == "" {
		return nil, nil, time.Time{}, nil
	}
	b, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, time.Time{}, nil
	}
	if err != nil {
		return nil, nil, time.Time{}, fmt.Errorf("mcpauth: token file: %w", err)
	}
	var st storedToken
	if err := json.Unmarshal(b, &st); err != nil || st.Token == nil {
		return nil, nil, time.Time{}, fmt.Errorf("mcpauth: token file %s is not one toolbus mcp-login wrote", f.path)
	}
	var mt time.Time
	if fi, err := os.Stat(f.path); err == nil {
		mt = fi.ModTime()
	}
	return st.config(), st.Token, mt, nil
}

// config is the oauth2 configuration that refreshes st's token.
func (st *storedToken) config() *oauth2.Config {
	return &oauth2.Config{ClientID: st.ClientID, ClientSecret: st.ClientSecret,
		Endpoint: oauth2.Endpoint{TokenURL: st.TokenURL, AuthStyle: oauth2.AuthStyle(st.AuthStyle)}}
}

// client is the stored form of oc's client and token endpoint.
func client(oc *oauth2.Config) *storedToken {
	return &storedToken{ClientID: oc.ClientID, ClientSecret: oc.ClientSecret, TokenURL: oc.Endpoint.TokenURL,
		AuthStyle: int(oc.Endpoint.AuthStyle)}
}

// loadChecked reports a token file that exists and is not one mcp-login wrote.
func (f *tokenFile) loadChecked() (bool, error) {
	_, t, _, err := f.load()
	return t != nil, err
}

// save writes the token beside its client, atomically (a rename), mode 0600. A failed
// write leaves the old file: the token in memory still serves this process.
func (f *tokenFile) save(oc *oauth2.Config, t *oauth2.Token) {
	if f.path == "" || t.RefreshToken == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	st := client(oc)
	st.Token = t
	b, err := json.Marshal(st)
	if err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), ".token-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Chmod(tmp.Name(), 0o600) != nil || os.Rename(tmp.Name(), f.path) != nil {
		_ = os.Remove(tmp.Name())
	}
}
