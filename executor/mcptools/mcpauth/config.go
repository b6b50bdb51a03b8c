// Package mcpauth authorizes toolbus's MCP client to HTTP MCP servers that require the
// authorization of the MCP specification (revision 2025-11-25): OAuth 2.1 with
// protected-resource metadata (RFC 9728), authorization-server metadata (RFC 8414 and
// OpenID Connect discovery), scopes from the server's challenge, step-up on
// insufficient_scope and the resource parameter (RFC 8707).
//
// Two grants suit a server-side tier:
//
//   - client_credentials: the executor is a confidential client of its own
//     (client_secret_basic, client_secret_post or private_key_jwt, RFC 7523). Nothing
//     interactive; the choice for unattended executors.
//   - authorization_code with PKCE: the server acts on behalf of a person. An operator
//     logs in once (Login: the URL is printed, the callback is received on loopback)
//     and the refresh token is kept in a token file the executors read and refresh.
//     The client is identified by a Client ID Metadata Document, a pre-registered
//     client id, or dynamic client registration, tried in that order.
//
// The flows are the MCP Go SDK's (auth.AuthorizationCodeHandler, oauthex) and
// golang.org/x/oauth2's; this package adds the client-credentials grant with the
// resource parameter and private_key_jwt, the token file, and the reporting of every
// credential to the executor's redaction (Options.OnSecret).
package mcpauth

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Grants of Config.Grant.
const (
	GrantClientCredentials = "client_credentials"
	GrantAuthorizationCode = "authorization_code"
)

// Token endpoint authentication methods of Config.TokenEndpointAuthMethod.
const (
	AuthClientSecretBasic = "client_secret_basic"
	AuthClientSecretPost  = "client_secret_post"
	AuthPrivateKeyJWT     = "private_key_jwt"
	AuthNone              = "none"
)

// DefaultRedirectURL is the redirect URL of the authorization-code grant when
// Config.RedirectURL is empty: the loopback address Login listens on.
const DefaultRedirectURL = "http://127.0.0.1:8976/callback"

// ErrConfig is wrapped by the errors of Config.Check.
var ErrConfig = errors.New("mcpauth: invalid configuration")

// ErrLoginRequired is wrapped by the error of an authorization that needs a person: the
// authorization-code grant has no usable token and no one to ask. `toolbus mcp-login`
// stores one.
var ErrLoginRequired = errors.New("mcpauth: the server needs an operator's login (toolbus mcp-login)")

// Config is the "oauth" object of an HTTP server in TOOLBUS_MCP_CONFIG. A value written
// "${NAME}" (ClientSecret, PrivateKey) is read from the executor's environment variable
// NAME when the configuration is loaded (Resolve), so the file itself holds no secret.
type Config struct {
	// Grant is "client_credentials" or "authorization_code" (the default).
	Grant string `json:"grant,omitempty"`
	// ClientID is the pre-registered client id (required for client_credentials).
	ClientID string `json:"clientId,omitempty"`
	// ClientSecret authenticates the client at the token endpoint
	// (client_secret_basic or client_secret_post).
	ClientSecret string `json:"clientSecret,omitempty"`
	// PrivateKey is a PEM private key (PKCS#8, EC or RSA) that signs the client's
	// assertion (private_key_jwt); SigningAlgorithm is ES256 (default for EC keys) or
	// RS256 (default for RSA keys).
	PrivateKey       string `json:"privateKey,omitempty"`
	SigningAlgorithm string `json:"signingAlgorithm,omitempty"`
	// TokenEndpointAuthMethod forces the client authentication; empty picks the first
	// the authorization server supports of private_key_jwt (with PrivateKey),
	// client_secret_basic, client_secret_post.
	TokenEndpointAuthMethod string `json:"tokenEndpointAuthMethod,omitempty"`
	// Scopes, when set, are requested instead of those the server asks for.
	Scopes []string `json:"scopes,omitempty"`
	// ClientMetadataURL is the HTTPS URL of the client's Client ID Metadata Document
	// (authorization_code; used when the authorization server supports it).
	ClientMetadataURL string `json:"clientMetadataUrl,omitempty"`
	// DynamicRegistration allows dynamic client registration (RFC 7591) when neither a
	// metadata document nor a client id applies (authorization_code; default true).
	DynamicRegistration *bool `json:"dynamicRegistration,omitempty"`
	// RedirectURL is the loopback URL the login receives the code on
	// (authorization_code; default DefaultRedirectURL).
	RedirectURL string `json:"redirectUrl,omitempty"`
	// TokenFile keeps the tokens of the authorization-code grant (written by the login
	// with mode 0600, rewritten when a refresh rotates the refresh token).
	TokenFile string `json:"tokenFile,omitempty"`
}

// Resolve returns c with its "${NAME}" values read from lookup (os.LookupEnv).
func (c Config) Resolve(lookup func(string) (string, bool)) (Config, error) {
	for _, f := range []*string{&c.ClientSecret, &c.PrivateKey, &c.ClientID} {
		v := *f
		if strings.HasPrefix(v, "${") && strings.HasSuffix(v, "}") && len(v) > 3 {
			name := v[2 : len(v)-1]
			val, ok := lookup(name)
			if !ok || val == "" {
				return c, fmt.Errorf("%w: the variable %s is not set", ErrConfig, name)
			}
			*f = val
		}
	}
	return c, nil
}

// Check reports an unusable configuration.
func (c Config) Check() error {
	switch c.Grant {
	case GrantClientCredentials:
		if c.ClientID == "" {
			return fmt.Errorf("%w: client_credentials needs clientId", ErrConfig)
		}
		if c.ClientSecret == "" && c.PrivateKey == "" {
			return fmt.Errorf("%w: client_credentials needs clientSecret or privateKey", ErrConfig)
		}
	case "", GrantAuthorizationCode:
		if c.ClientID == "" && c.ClientMetadataURL == "" && !c.dynamic() {
			return fmt.Errorf("%w: authorization_code needs clientId, clientMetadataUrl or dynamicRegistration", ErrConfig)
		}
		if u, err := url.Parse(c.redirectURL()); err != nil || u.Host == "" {
			return fmt.Errorf("%w: redirectUrl %q is not an absolute URL", ErrConfig, c.RedirectURL)
		}
	default:
		return fmt.Errorf("%w: grant %q: want %s or %s", ErrConfig, c.Grant, GrantClientCredentials, GrantAuthorizationCode)
	}
	if m := c.TokenEndpointAuthMethod; m != "" && !slices.Contains([]string{AuthClientSecretBasic, AuthClientSecretPost, AuthPrivateKeyJWT, AuthNone}, m) {
		return fmt.Errorf("%w: tokenEndpointAuthMethod %q", ErrConfig, m)
	}
	if c.PrivateKey != "" {
		if _, _, err := parseKey(c.PrivateKey, c.SigningAlgorithm); err != nil {
			return fmt.Errorf("%w: privateKey: %v", ErrConfig, err)
		}
	}
	return nil
}

// Secrets are the credentials of c the executor must redact.
func (c Config) Secrets() []string {
	out := []string{c.ClientSecret}
	if c.PrivateKey != "" {
		out = append(out, c.PrivateKey)
		// A PEM key is also printed line by line: each base64 line is a secret too.
		for _, l := range strings.Split(c.PrivateKey, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "-----") {
				out = append(out, l)
			}
		}
	}
	return out
}

func (c Config) dynamic() bool { return c.DynamicRegistration == nil || *c.DynamicRegistration }

func (c Config) redirectURL() string {
	if c.RedirectURL == "" {
		return DefaultRedirectURL
	}
	return c.RedirectURL
}
