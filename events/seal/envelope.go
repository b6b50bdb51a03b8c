package seal

import (
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
	b := make([]byte, 0, 160+len(s.keyIDJSON))
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
	raw := attr(h, ExtMaterial)
	if raw == "" {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return "", false
	}
	var env struct {
		Payload     string `json:"payload"`
		PayloadType string `json:"payloadType"`
	}
	if json.Unmarshal(b, &env) != nil || env.PayloadType != PayloadType {
		return "", false
	}
	var m [33]byte // DecodedLen of 44 characters
	if len(env.Payload) != base64.StdEncoding.EncodedLen(32) {
		return "", false
	}
	if n, err := base64.StdEncoding.Decode(m[:], []byte(env.Payload)); err != nil || n != 32 {
		return "", false
	}
	return DigestPrefix + hex.EncodeToString(m[:32]), true
}
