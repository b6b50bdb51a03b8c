package seal

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"

	"github.com/nats-io/nats.go"
)

// envelope is the dssematerial of a signature: the DSSE envelope of the material m and
// its signature sig, as JSON, base64. It appends the very bytes json.Marshal writes of
// an Envelope (TestEnvelopeIsJSONMarshal) without its reflection: signing is on every
// publish's path.
func (s *Signer) envelope(m [32]byte, sig []byte) string {
	var buf [384]byte // the envelope of a key id up to 150 bytes long, on the stack
	b := buf[:0]
	b = append(b, `{"payload":"`...)
	b = base64.StdEncoding.AppendEncode(b, m[:])
	b = append(b, `","payloadType":"`+PayloadType+`","signatures":[{"keyid":`...)
	b = append(b, s.keyIDJSON...)
	b = append(b, `,"sig":"`...)
	b = base64.StdEncoding.AppendEncode(b, sig)
	b = append(b, `"}]}`...)
	return base64.StdEncoding.EncodeToString(b)
}

// signedDigest is the digest a signed event's envelope signs (its payload, which is
// Digest of the event as signed), read rather than computed: a child names its parent
// with it. false when h carries no envelope of this package's payload type. A verifier
// never takes it on trust: it computes every event's Digest, so a child of an event
// whose envelope lies names an event the run does not hold.
func signedDigest(h nats.Header) (string, bool) {
	m, ok := SignedMaterial(h)
	if !ok {
		return "", false
	}
	return DigestPrefix + hex.EncodeToString(m[:]), true
}

// envelopeHead is how every envelope a Signer writes begins, up to its payload, and
// envelopeType what follows the payload: SignedMaterial reads the payload at its place
// without a JSON decoder (which cost twice a Digest), any other envelope with one.
const (
	envelopeHead = `{"payload":"`
	envelopeType = `","payloadType":"` + PayloadType + `",`
)

// SignedMaterial is the verification material the envelope of a signed event (header
// h) claims to sign, unverified: what a child names its parent with, and the leaf the
// checkpoint service takes for it (audit/checkpoint). false when h carries no envelope
// of this package's payload type whose payload is 32 bytes.
func SignedMaterial(h nats.Header) (m [32]byte, ok bool) {
	raw := attr(h, ExtMaterial)
	if raw == "" {
		return m, false
	}
	const n = 44 // base64 of 32 bytes
	payload := ""
	// The head of the envelope, decoded from the head of raw (whole base64 quanta).
	const headLen = (len(envelopeHead) + n + len(envelopeType) + 2) / 3 * 4
	var src [headLen]byte
	var dst [headLen / 4 * 3]byte
	if len(raw) >= headLen {
		copy(src[:], raw)
		if k, err := base64.StdEncoding.Decode(dst[:], src[:]); err == nil {
			if rest, ok := bytes.CutPrefix(dst[:k], []byte(envelopeHead)); ok && len(rest) >= n && bytes.HasPrefix(rest[n:], []byte(envelopeType)) {
				payload = string(rest[:n])
			}
		}
	}
	if payload == "" {
		b, err := base64.StdEncoding.DecodeString(raw)
		var env struct {
			Payload     string `json:"payload"`
			PayloadType string `json:"payloadType"`
		}
		if err != nil || json.Unmarshal(b, &env) != nil || env.PayloadType != PayloadType {
			return m, false
		}
		payload = env.Payload
	}
	var d [33]byte // DecodedLen of 44 characters
	if len(payload) != n {
		return m, false
	}
	if k, err := base64.StdEncoding.Decode(d[:], []byte(payload)); err != nil || k != 32 {
		return m, false
	}
	copy(m[:], d[:32])
	return m, true
}
