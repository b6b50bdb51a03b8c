package seal

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/nats-io/nats.go"
)

// KeyFile is a signing key as toolbus admin writes it beside a user's credentials
// (<user>.sign, mode 0600; TOOLBUS_SIGNING_KEY names it): its key id, the signer it
// belongs to and its ed25519 seed.
type KeyFile struct {
	KeyID  string `json:"keyid"`
	Signer string `json:"signer"`
	Seed   []byte `json:"seed"`
}

// KeyID is the key id of a signer's public key: "<signer>/<16 hex of sha256(key)>".
func KeyID(signer string, pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return signer + "/" + hex.EncodeToString(sum[:8])
}

// NewKeyFile makes a new key of signer.
func NewKeyFile(signer string) (KeyFile, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return KeyFile{}, fmt.Errorf("seal: %w", err)
	}
	return KeyFile{KeyID: KeyID(signer, pub), Signer: signer, Seed: priv.Seed()}, nil
}

// Public is the key's public half.
func (k KeyFile) Public() ed25519.PublicKey {
	return ed25519.NewKeyFromSeed(k.Seed).Public().(ed25519.PublicKey)
}

// SignerOf is a Signer of the key k.
func SignerOf(k KeyFile) *Signer { return NewSigner(k.KeyID, ed25519.NewKeyFromSeed(k.Seed)) }

// WriteKeyFile writes k to file, readable by its owner only.
func WriteKeyFile(file string, k KeyFile) error {
	b, err := json.Marshal(k)
	if err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	if err := os.WriteFile(file, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	return nil
}

// ReadKeyFile reads a key file.
func ReadKeyFile(file string) (KeyFile, error) {
	var k KeyFile
	b, err := os.ReadFile(file)
	if err != nil {
		return k, fmt.Errorf("seal: signing key: %w", err)
	}
	if err := json.Unmarshal(b, &k); err != nil || len(k.Seed) != ed25519.SeedSize || k.KeyID == "" {
		return k, fmt.Errorf("seal: signing key %s: not a toolbus signing key (want {keyid, signer, seed})", file)
	}
	if want := KeyID(k.Signer, k.Public()); k.KeyID != want {
		return k, fmt.Errorf("seal: signing key %s: key id %s is not its key's (%s)", file, k.KeyID, want)
	}
	return k, nil
}

// LoadSigner reads a key file and returns its Signer.
func LoadSigner(file string) (*Signer, error) {
	k, err := ReadKeyFile(file)
	if err != nil {
		return nil, err
	}
	return SignerOf(k), nil
}

// parent is the event a handler is handling: the digest is computed on first use.
type parent struct {
	h      nats.Header
	data   []byte
	once   sync.Once
	digest string
}

type parentKey struct{}

// WithParent returns ctx carrying the event (h, data) being handled: every event
// published with ctx names it as prevdigest. The consumers' dispatch sets it for each
// message it hands to a handler.
func WithParent(ctx context.Context, h nats.Header, data []byte) context.Context {
	return context.WithValue(ctx, parentKey{}, &parent{h: h, data: data})
}

// WithParentDigest returns ctx naming digest as the parent of the events published with it.
func WithParentDigest(ctx context.Context, digest string) context.Context {
	p := &parent{digest: digest}
	p.once.Do(func() {})
	return context.WithValue(ctx, parentKey{}, p)
}

// ParentDigest returns the digest of the event ctx carries (WithParent), "" for none,
// computed once however many events the handler publishes: a signed parent's is the
// digest its signature carries (signedDigest), an unsigned one's is computed.
func ParentDigest(ctx context.Context) string {
	p, _ := ctx.Value(parentKey{}).(*parent)
	if p == nil {
		return ""
	}
	p.once.Do(func() {
		if len(p.h["ce-id"]) == 0 {
			return
		}
		if d, ok := signedDigest(p.h); ok {
			p.digest = d
			return
		}
		p.digest = Digest(p.h, p.data)
	})
	return p.digest
}
