package seal_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/toolbus/toolbus/events/seal"
)

// TestEnvelopeIsJSONMarshal: the envelope a signer appends by hand is byte for byte
// what encoding/json writes of it, so a verifier in any language reads a plain DSSE
// envelope.
func TestEnvelopeIsJSONMarshal(t *testing.T) {
	kf, _ := seal.NewKeyFile(`team.a"<&>`) // characters JSON escapes
	h, _ := signed(t, kf)
	raw, err := base64.StdEncoding.DecodeString(h[seal.HeaderMaterial][0])
	if err != nil {
		t.Fatal(err)
	}
	var env seal.Envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(env)
	if !bytes.Equal(raw, want) {
		t.Fatalf("envelope\n%s\nwant\n%s", raw, want)
	}
}

// TestParentDigestOfSignedEvent: the digest a child names of a signed parent, read
// from the parent's signature, is the digest a verifier computes; an unsigned parent's
// is computed.
func TestParentDigestOfSignedEvent(t *testing.T) {
	kf, _ := seal.NewKeyFile("team.alpha")
	h, data := signed(t, kf)
	if got, want := seal.ParentDigest(seal.WithParent(context.Background(), h, data)), seal.Digest(h, data); got != want {
		t.Fatalf("signed parent: %s, want %s", got, want)
	}
	// Another signer's envelope, the same JSON in another order, is read too (the
	// decoder's way, not the fast one).
	raw, _ := base64.StdEncoding.DecodeString(h[seal.HeaderMaterial][0])
	var env map[string]any
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatal(err)
	}
	sigs, _ := json.Marshal(env["signatures"])
	other := `{"signatures":` + string(sigs) + `,"payloadType":"` + seal.PayloadType + `","payload":"` + env["payload"].(string) + `"}`
	h[seal.HeaderMaterial] = []string{base64.StdEncoding.EncodeToString([]byte(other))}
	if got, want := seal.ParentDigest(seal.WithParent(context.Background(), h, data)), seal.Digest(h, data); got != want {
		t.Fatalf("signed parent, another envelope's order: %s, want %s", got, want)
	}
	m, ok := seal.SignedMaterial(h)
	if want := seal.Digest(h, data); !ok || seal.DigestPrefix+hex.EncodeToString(m[:]) != want {
		t.Fatalf("signed material %x %v, want %s", m, ok, want)
	}
	delete(h, seal.HeaderMaterial)
	delete(h, seal.HeaderSigned)
	if _, ok := seal.SignedMaterial(h); ok {
		t.Fatal("an unsigned event claims a signed material")
	}
	if got, want := seal.ParentDigest(seal.WithParent(context.Background(), h, data)), seal.Digest(h, data); got != want || got == "" {
		t.Fatalf("unsigned parent: %s, want %s", got, want)
	}
}

// BenchmarkParentDigest is what a handler pays to name a signed parent (BenchmarkDigest:
// computing it).
func BenchmarkParentDigest(b *testing.B) {
	kf, _ := seal.NewKeyFile("team.alpha")
	h, data := signed(&testing.T{}, kf)
	for b.Loop() {
		_ = seal.ParentDigest(seal.WithParent(context.Background(), h, data))
	}
}
