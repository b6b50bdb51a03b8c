package seal_test

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

func signed(t *testing.T, kf seal.KeyFile) (map[string][]string, []byte) {
	t.Helper()
	e := events.ToolFinishedEvent("/toolbus/executor/x", toolbus.ToolFinished{RunID: "r1", Step: 0,
		ToolResult: toolbus.ToolResult{CallID: "c1", Tool: "calc", Status: toolbus.StatusSucceeded, Content: "2"}})
	msg, err := events.Encode(e.Subject, e.Meta, e.Data)
	if err != nil {
		t.Fatal(err)
	}
	msg.Header[seal.HeaderPrevDigest] = []string{"sha256:00"}
	if err := seal.SignerOf(kf).Sign(msg.Header, msg.Data); err != nil {
		t.Fatal(err)
	}
	return msg.Header, msg.Data
}

// TestSealSignsAttributesDataAndChain: a signed event verifies with its key and names
// its signer; any altered attribute, extension (the chain's prevdigest among them) or
// data byte, or another key, fails with ErrBadSignature; no material is ErrUnsigned.
func TestSealSignsAttributesDataAndChain(t *testing.T) {
	kf, _ := seal.NewKeyFile(seal.SignerName(seal.KindTeam, "alpha"))
	other, _ := seal.NewKeyFile(seal.SignerName(seal.KindTeam, "beta"))
	keys := func(ids ...seal.KeyFile) seal.KeyFunc {
		return func(id string) (ed25519.PublicKey, bool) {
			for _, k := range ids {
				if k.KeyID == id {
					return k.Public(), true
				}
			}
			return nil, false
		}
	}
	h, data := signed(t, kf)
	if id, err := seal.Verify(h, data, keys(kf)); err != nil || id != kf.KeyID {
		t.Fatalf("untouched: %s, %v", id, err)
	}
	d1 := seal.Digest(h, data)
	for name, alter := range map[string]func(h map[string][]string, d []byte) []byte{
		"data": func(h map[string][]string, d []byte) []byte { return append([]byte(nil), d[:len(d)-1]...) },
		"type": func(h map[string][]string, d []byte) []byte {
			h["ce-type"] = []string{"toolbus.tool.waiting"}
			return d
		},
		"time": func(h map[string][]string, d []byte) []byte {
			h["ce-time"] = []string{"2020-01-01T00:00:00Z"}
			return d
		},
		"prevdigest": func(h map[string][]string, d []byte) []byte {
			h[seal.HeaderPrevDigest] = []string{"sha256:01"}
			return d
		},
		"callid": func(h map[string][]string, d []byte) []byte { h["ce-callid"] = []string{"c2"}; return d },
	} {
		h2 := map[string][]string{}
		for k, v := range h {
			h2[k] = v
		}
		d2 := alter(h2, data)
		if _, err := seal.Verify(h2, d2, keys(kf)); !errors.Is(err, seal.ErrBadSignature) {
			t.Errorf("%s altered: %v, want ErrBadSignature", name, err)
		}
		if seal.Digest(h2, d2) == d1 {
			t.Errorf("%s altered: same digest", name)
		}
	}
	if _, err := seal.Verify(h, data, keys(other)); !errors.Is(err, seal.ErrBadSignature) {
		t.Errorf("unknown key: %v", err)
	}
	delete(h, seal.HeaderMaterial)
	if _, err := seal.Verify(h, data, keys(kf)); !errors.Is(err, seal.ErrUnsigned) {
		t.Errorf("no material: %v", err)
	}
}

// BenchmarkSign is the cost a publisher pays per event: the material, the envelope and
// one ed25519 signature (BenchmarkDigest: what naming the previous event costs).
func BenchmarkSign(b *testing.B) {
	kf, _ := seal.NewKeyFile("team.alpha")
	s := seal.SignerOf(kf)
	h, data := signed(&testing.T{}, kf)
	for b.Loop() {
		if err := s.Sign(h, data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDigest(b *testing.B) {
	kf, _ := seal.NewKeyFile("team.alpha")
	h, data := signed(&testing.T{}, kf)
	for b.Loop() {
		_ = seal.Digest(h, data)
	}
}
