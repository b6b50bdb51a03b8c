package mcpauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// clientAssertionType is the client_assertion_type of private_key_jwt (RFC 7523 §2.2).
const clientAssertionType = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

// parseKey reads a PEM private key and the signing method of alg (empty: ES256 for an
// EC key, RS256 for an RSA key).
func parseKey(pemText, alg string) (crypto.Signer, jwt.SigningMethod, error) {
	block, _ := pem.Decode([]byte(pemText))
	if block == nil {
		return nil, nil, errors.New("not a PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, nil, err
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		m := map[string]jwt.SigningMethod{"": jwt.SigningMethodES256, "ES256": jwt.SigningMethodES256,
			"ES384": jwt.SigningMethodES384, "ES512": jwt.SigningMethodES512}[alg]
		if m == nil {
			return nil, nil, fmt.Errorf("signing algorithm %q does not fit an EC key (ES256, ES384, ES512)", alg)
		}
		return k, m, nil
	case *rsa.PrivateKey:
		m := map[string]jwt.SigningMethod{"": jwt.SigningMethodRS256, "RS256": jwt.SigningMethodRS256,
			"PS256": jwt.SigningMethodPS256}[alg]
		if m == nil {
			return nil, nil, fmt.Errorf("signing algorithm %q does not fit an RSA key (RS256, PS256)", alg)
		}
		return k, m, nil
	}
	return nil, nil, fmt.Errorf("key type %T: want EC or RSA", key)
}

// assertion returns a fresh client assertion of clientID for the authorization server
// audience (its issuer), valid for five minutes.
func assertion(pemText, alg, clientID, audience string) (string, error) {
	key, method, err := parseKey(pemText, alg)
	if err != nil {
		return "", err
	}
	now := time.Now()
	claims := jwt.RegisteredClaims{Issuer: clientID, Subject: clientID, Audience: jwt.ClaimStrings{audience},
		IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(5 * time.Minute)), ID: rand.Text()}
	return jwt.NewWithClaims(method, claims).SignedString(key)
}
