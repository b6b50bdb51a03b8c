package mcpauth_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
)

func ecKey(t *testing.T) string {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// TestConfigCheck: each grant asks for what it needs; a key that does not parse or does
// not fit its algorithm is refused at load, not at the first call.
func TestConfigCheck(t *testing.T) {
	key := ecKey(t)
	no := false
	for _, c := range []struct {
		name string
		cfg  mcpauth.Config
		bad  string
	}{
		{"client secret", mcpauth.Config{Grant: "client_credentials", ClientID: "a", ClientSecret: "s"}, ""},
		{"private key", mcpauth.Config{Grant: "client_credentials", ClientID: "a", PrivateKey: key}, ""},
		{"no client id", mcpauth.Config{Grant: "client_credentials", ClientSecret: "s"}, "needs clientId"},
		{"no credential", mcpauth.Config{Grant: "client_credentials", ClientID: "a"}, "clientSecret or privateKey"},
		{"key of the wrong algorithm", mcpauth.Config{Grant: "client_credentials", ClientID: "a", PrivateKey: key, SigningAlgorithm: "RS256"}, "does not fit"},
		{"not a key", mcpauth.Config{Grant: "client_credentials", ClientID: "a", PrivateKey: "nope"}, "PEM"},
		{"authorization code by registration", mcpauth.Config{}, ""},
		{"authorization code without identity", mcpauth.Config{DynamicRegistration: &no}, "needs clientId"},
		{"unknown grant", mcpauth.Config{Grant: "password"}, "grant"},
		{"unknown method", mcpauth.Config{TokenEndpointAuthMethod: "tls_client_auth"}, "tokenEndpointAuthMethod"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Check()
			if c.bad == "" && err != nil || c.bad != "" && (err == nil || !strings.Contains(err.Error(), c.bad) || !errors.Is(err, mcpauth.ErrConfig)) {
				t.Fatalf("Check() = %v, want %q", err, c.bad)
			}
		})
	}
}

// TestConfigResolveAndSecrets: "${NAME}" values come from the environment, an unset one
// is an error, and the secrets to redact are the client secret, the key and each of its
// lines.
func TestConfigResolveAndSecrets(t *testing.T) {
	key := ecKey(t)
	env := map[string]string{"S": "the-client-secret", "K": key}
	lookup := func(n string) (string, bool) { v, ok := env[n]; return v, ok }
	c, err := mcpauth.Config{Grant: "client_credentials", ClientID: "a", ClientSecret: "${S}", PrivateKey: "${K}"}.Resolve(lookup)
	if err != nil || c.ClientSecret != env["S"] || c.PrivateKey != key {
		t.Fatalf("Resolve = %+v, %v", c, err)
	}
	s := c.Secrets()
	if !slices.Contains(s, env["S"]) || !slices.Contains(s, key) || !slices.Contains(s, strings.Split(key, "\n")[1]) {
		t.Fatalf("Secrets() = %q", s)
	}
	if _, err := (mcpauth.Config{ClientSecret: "${MISSING}"}).Resolve(lookup); !errors.Is(err, mcpauth.ErrConfig) {
		t.Fatalf("an unset variable: %v", err)
	}
}
