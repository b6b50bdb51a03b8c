package seal

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// Signers' names: the kind and the name, joined by a dot (a KV key's characters).
const (
	KindRole   = "role"
	KindTeam   = "team"
	KindClient = "client"
)

// SignerName is "<kind>.<name>": role.planner, team.alpha, client.bob.
func SignerName(kind, name string) string { return kind + "." + name }

// Span is when a key held a grant: from From, until Until (zero: still).
type Span struct {
	From  time.Time `json:"from"`
	Until time.Time `json:"until,omitzero"`
}

// Holds reports whether the span covers t.
func (s Span) Holds(t time.Time) bool {
	return !t.Before(s.From) && (s.Until.IsZero() || t.Before(s.Until))
}

// Key is the public half of one signing key as toolbus admin publishes it (the
// keyring file signers.json of a deployment, and the core's bucket toolbus_signers, one
// key per key id): who signs with it, since when, until when, and what it was granted.
type Key struct {
	KeyID  string            `json:"keyid"`
	Signer string            `json:"signer"`
	Public ed25519.PublicKey `json:"public"`
	// Created is when the key was issued; Retired when a rotation replaced it (events
	// it signs after that are refused; those before stay valid); Revoked when it was
	// revoked (a team or client removed): from then on nothing it signs is valid.
	Created time.Time `json:"created"`
	Retired time.Time `json:"retired,omitzero"`
	Revoked time.Time `json:"revoked,omitzero"`
	// Tools are a team's tools and Identities a client's, each with the span it held
	// them (a tool revoked from a team ends its span, so older runs stay valid).
	Tools      map[string][]Span `json:"tools,omitempty"`
	Identities map[string][]Span `json:"identities,omitempty"`
}

// Kind is the kind of the key's signer (role, team or client) and Name its name.
func (k Key) Kind() string { kind, _, _ := strings.Cut(k.Signer, "."); return kind }

// Name is the name of the key's signer (planner, alpha, bob).
func (k Key) Name() string { _, name, _ := strings.Cut(k.Signer, "."); return name }

// ValidAt says why the key may not sign at t ("" when it may).
func (k Key) ValidAt(t time.Time) string {
	switch {
	case !k.Revoked.IsZero() && !t.Before(k.Revoked):
		return fmt.Sprintf("key %s was revoked from %s", k.KeyID, k.Revoked.UTC().Format(time.RFC3339))
	case !k.Retired.IsZero() && !t.Before(k.Retired):
		return fmt.Sprintf("key %s was retired by a rotation at %s", k.KeyID, k.Retired.UTC().Format(time.RFC3339))
	}
	return ""
}

// Granted reports whether the key's grants (Tools or Identities) held name at t.
func Granted(grants map[string][]Span, name string, t time.Time) bool {
	return slices.ContainsFunc(grants[name], func(s Span) bool { return s.Holds(t) })
}

// Keyring is the public keys of a deployment, every key ever issued.
type Keyring struct {
	Keys []Key `json:"keys"`
}

// Lookup returns the key of id.
func (r Keyring) Lookup(id string) (Key, bool) {
	i := slices.IndexFunc(r.Keys, func(k Key) bool { return k.KeyID == id })
	if i < 0 {
		return Key{}, false
	}
	return r.Keys[i], true
}

// KeyFunc is the keys of the ring for Verify.
func (r Keyring) KeyFunc() KeyFunc {
	return func(id string) (ed25519.PublicKey, bool) {
		k, ok := r.Lookup(id)
		return k.Public, ok
	}
}

// Current returns the index of the signer's current key (not retired nor revoked), -1
// for none.
func (r Keyring) Current(signer string) int {
	return slices.IndexFunc(r.Keys, func(k Key) bool { return k.Signer == signer && k.Retired.IsZero() && k.Revoked.IsZero() })
}

// ReadKeyring reads a keyring file (a missing one is an empty ring).
func ReadKeyring(file string) (Keyring, error) {
	var r Keyring
	b, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("seal: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("seal: keyring %s: %w", file, err)
	}
	return r, nil
}

// WriteKeyring writes the keyring file.
func WriteKeyring(file string, r Keyring) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	return nil
}
