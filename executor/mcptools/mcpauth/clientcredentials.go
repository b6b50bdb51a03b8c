package mcpauth

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// clientCredentials is the auth.OAuthHandler of the client-credentials grant: on a 401
// (or a 403 insufficient_scope) it discovers the server's authorization server and
// takes a token for the scopes asked, with the resource parameter. The SDK's extauth
// handler does not send the resource nor support private_key_jwt, hence this one.
type clientCredentials struct {
	cfg  Config
	hc   *http.Client
	opts Options
	obs  func(*oauth2.Token)

	mu      sync.Mutex
	ts      oauth2.TokenSource
	granted []string
}

var _ auth.OAuthHandler = (*clientCredentials)(nil)

func (h *clientCredentials) TokenSource(context.Context) (oauth2.TokenSource, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ts, nil
}

func (h *clientCredentials) Authorize(ctx context.Context, req *http.Request, resp *http.Response) error {
	defer resp.Body.Close()
	defer io.Copy(io.Discard, resp.Body) //nolint:errcheck // draining
	d, err := discover(ctx, req, resp, h.hc)
	if err != nil || d == nil {
		return err
	}
	h.mu.Lock()
	scopes := union(h.granted, d.scopes)
	h.mu.Unlock()
	if len(h.cfg.Scopes) > 0 {
		scopes = h.cfg.Scopes
	}
	method := h.cfg.TokenEndpointAuthMethod
	if method == "" {
		method = pickMethod(d.as.TokenEndpointAuthMethodsSupported, h.cfg.PrivateKey != "", h.cfg.ClientSecret != "")
	}
	src := &ccSource{cfg: h.cfg, method: method, tokenURL: d.as.TokenEndpoint, audience: d.as.Issuer,
		scopes: scopes, resource: d.resource, hc: h.hc}
	var ts oauth2.TokenSource
	if h.opts.Tokens != nil {
		ts = h.shared(req, src)
	} else {
		ts = observe(oauth2.ReuseTokenSourceWithExpiry(nil, src, h.opts.early()), h.obs)
	}
	if _, err := ts.Token(); err != nil {
		return fmt.Errorf("mcpauth: client credentials token: %w", err)
	}
	h.mu.Lock()
	h.ts, h.granted = ts, scopes
	h.mu.Unlock()
	return nil
}

// shared is the token source of src shared with the deployment's other instances: the
// token the instances hold for this server, client and scopes, taken anew by one of
// them when it is due, or when it is the one the server just refused in req.
func (h *clientCredentials) shared(req *http.Request, src *ccSource) oauth2.TokenSource {
	server := h.opts.Server
	if server == "" {
		u := *req.URL
		u.RawQuery = ""
		server = u.String()
	}
	ss := newSharedSource(h.opts.Tokens, sharedName(server, GrantClientCredentials, h.cfg.ClientID, src.scopes), h.opts.early(), h.opts.logger())
	ss.renew = func(*sharedRecord) (*sharedRecord, error) {
		t, err := src.Token()
		if err != nil {
			return nil, err
		}
		return &sharedRecord{Token: t}, nil
	}
	ss.obs = func(r *sharedRecord) {
		if r.Token != nil {
			h.obs(r.Token)
		}
	}
	ss.reject(strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "))
	return ss
}

// ccSource takes a new token at the token endpoint each time it is asked (the
// ReuseTokenSource before it asks only when the token is about to expire).
type ccSource struct {
	cfg                        Config
	method, tokenURL, audience string
	resource                   string
	scopes                     []string
	hc                         *http.Client
}

func (s *ccSource) Token() (*oauth2.Token, error) {
	c := clientcredentials.Config{ClientID: s.cfg.ClientID, TokenURL: s.tokenURL, Scopes: s.scopes,
		EndpointParams: url.Values{}}
	if s.resource != "" {
		c.EndpointParams.Set("resource", s.resource)
	}
	switch s.method {
	case AuthPrivateKeyJWT:
		a, err := assertion(s.cfg.PrivateKey, s.cfg.SigningAlgorithm, s.cfg.ClientID, s.audience)
		if err != nil {
			return nil, fmt.Errorf("client assertion: %w", err)
		}
		c.AuthStyle = oauth2.AuthStyleInParams
		c.EndpointParams.Set("client_assertion_type", clientAssertionType)
		c.EndpointParams.Set("client_assertion", a)
	case AuthClientSecretPost:
		c.ClientSecret, c.AuthStyle = s.cfg.ClientSecret, oauth2.AuthStyleInParams
	default:
		c.ClientSecret, c.AuthStyle = s.cfg.ClientSecret, oauth2.AuthStyleInHeader
	}
	return c.Token(context.WithValue(context.Background(), oauth2.HTTPClient, s.hc))
}

// pickMethod is the first method the authorization server supports of those the
// client can use (private_key_jwt with a key, then client_secret_basic and
// client_secret_post with a secret); the first the client can use when the server
// lists none of them (client_secret_basic is RFC 8414's default).
func pickMethod(supported []string, haveKey, haveSecret bool) string {
	var prefs []string
	if haveKey {
		prefs = append(prefs, AuthPrivateKeyJWT)
	}
	if haveSecret {
		prefs = append(prefs, AuthClientSecretBasic, AuthClientSecretPost)
	}
	for _, m := range prefs {
		if slices.Contains(supported, m) {
			return m
		}
	}
	if haveSecret {
		return AuthClientSecretBasic
	}
	return AuthPrivateKeyJWT
}

// discovery is what a 401 or 403 tells the client: the resource, its authorization
// server's metadata and the scopes asked.
type discovery struct {
	resource string
	as       *oauthex.AuthServerMeta
	scopes   []string
}

// discover follows the 2025-11-25 discovery: the protected-resource metadata named by
// WWW-Authenticate, else at the well-known path of the endpoint, else at the root; then
// the authorization server's metadata (RFC 8414, then OpenID Connect, with path
// insertion, auth.GetAuthServerMetadata); the scopes of the challenge, else the
// resource's scopes_supported. A 403 that is not insufficient_scope returns nil, nil:
// the request is tried again as is and its error reported.
func discover(ctx context.Context, req *http.Request, resp *http.Response, hc *http.Client) (*discovery, error) {
	cs, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	if err != nil {
		return nil, fmt.Errorf("mcpauth: WWW-Authenticate: %w", err)
	}
	if resp.StatusCode == http.StatusForbidden && param(cs, "error") != "insufficient_scope" {
		return nil, nil
	}
	endpoint := req.URL.String()
	prm := resourceMetadata(ctx, param(cs, "resource_metadata"), endpoint, hc)
	if prm == nil {
		// 2025-03-26: no resource metadata, the server's origin is its authorization server.
		u := *req.URL
		u.Path, u.RawQuery = "", ""
		prm = &oauthex.ProtectedResourceMetadata{Resource: endpoint, AuthorizationServers: []string{u.String()}}
	}
	if len(prm.AuthorizationServers) == 0 {
		return nil, fmt.Errorf("mcpauth: the protected resource metadata of %s names no authorization server", endpoint)
	}
	issuer := prm.AuthorizationServers[0]
	as, err := auth.GetAuthServerMetadata(ctx, issuer, hc)
	if err != nil {
		return nil, fmt.Errorf("mcpauth: authorization server metadata: %w", err)
	}
	if as == nil {
		as = &oauthex.AuthServerMeta{Issuer: issuer, AuthorizationEndpoint: issuer + "/authorize",
			TokenEndpoint: issuer + "/token", RegistrationEndpoint: issuer + "/register"}
	}
	scopes := strings.Fields(param(cs, "scope"))
	if len(scopes) == 0 {
		scopes = prm.ScopesSupported
	}
	return &discovery{resource: prm.Resource, as: as, scopes: scopes}, nil
}

// resourceMetadata returns the first protected-resource metadata found, or nil.
func resourceMetadata(ctx context.Context, named, endpoint string, hc *http.Client) *oauthex.ProtectedResourceMetadata {
	type try struct{ meta, resource string }
	var tries []try
	if named != "" {
		tries = append(tries, try{named, endpoint})
	}
	if ru, err := url.Parse(endpoint); err == nil {
		mu := *ru
		mu.RawQuery = ""
		mu.Path = "/.well-known/oauth-protected-resource/" + strings.TrimLeft(ru.Path, "/")
		tries = append(tries, try{mu.String(), endpoint})
		mu.Path = "/.well-known/oauth-protected-resource"
		root := *ru
		root.Path, root.RawQuery = "", ""
		tries = append(tries, try{mu.String(), root.String()})
	}
	for _, t := range tries {
		if prm, err := oauthex.GetProtectedResourceMetadata(ctx, t.meta, t.resource, hc); err == nil && prm != nil {
			return prm
		}
	}
	return nil
}

// param is the parameter name of the first Bearer challenge that has it.
func param(cs []oauthex.Challenge, name string) string {
	for _, c := range cs {
		if v := c.Params[name]; v != "" && (c.Scheme == "bearer" || name == "resource_metadata") {
			return v
		}
	}
	return ""
}

// union is a's scopes then b's not in a.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
