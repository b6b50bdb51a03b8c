// Package seal signs toolbus events and chains each to the event that caused it, in
// the message itself: no extra message per event, nothing a verifier in another
// language cannot check.
//
// The signature is the CloudEvents verifiability extension (cloudevents/spec
// cloudevents/extensions/verifiability.md, payload type
// https://cloudevents.io/verifiability/dsse/v0.1): a DSSE v1.0.2 envelope, signed with
// ed25519, over the SHA-256 digest of the digests of the event's attributes, its data
// and the extension attributes it lists in signedextattrs; the envelope, base64, is the
// dssematerial attribute (ce-dssematerial in binary mode). toolbus signs every
// extension attribute the event carries, prevdigest among them.
//
// The chain is the extension attribute prevdigest: "sha256:" and the hex of the
// verification material (the digest above) of the event whose handling published this
// one (the message a worker consumed: a tool.finished names its call's tool.requested;
// WithParent). So a removed, altered or inserted event breaks the chain where an event
// names one the run does not hold, and a reordered one where an event comes before the
// one it names.
package seal

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// PayloadType is the DSSE payload type of the CloudEvents verifiability extension.
const PayloadType = "https://cloudevents.io/verifiability/dsse/v0.1"

// The extension attributes of this package, and their binary-mode headers.
const (
	ExtMaterial      = "dssematerial"
	ExtSigned        = "signedextattrs"
	ExtPrevDigest    = "prevdigest"
	HeaderMaterial   = "ce-" + ExtMaterial
	HeaderSigned     = "ce-" + ExtSigned
	HeaderPrevDigest = "ce-" + ExtPrevDigest
	// DigestPrefix starts every prevdigest value.
	DigestPrefix = "sha256:"
)

// coreAttrs are the CloudEvents core attributes, in the order the material digests
// them (datacontenttype is Content-Type in binary mode).
var coreAttrs = []string{"id", "source", "specversion", "type", "datacontenttype", "dataschema", "subject", "time"}

// Errors a verifier branches on.
var (
	// ErrUnsigned: the event carries no dssematerial.
	ErrUnsigned = errors.New("unsigned")
	// ErrBadSignature: the envelope does not parse, is signed by no key given, its
	// signature does not verify, or it signs another event than this one.
	ErrBadSignature = errors.New("bad signature")
)

// Envelope is a DSSE v1.0.2 JSON envelope.
type Envelope struct {
	Payload     string      `json:"payload"`
	PayloadType string      `json:"payloadType"`
	Signatures  []Signature `json:"signatures"`
}

// Signature is one signature of an Envelope.
type Signature struct {
	KeyID string `json:"keyid"`
	Sig   string `json:"sig"`
}

// PAE is DSSE's pre-authentication encoding of a payload of type typ: what is signed.
func PAE(typ string, body []byte) []byte { return appendPAE(nil, typ, body) }

// appendPAE appends PAE(typ, body) to b (a signer's stack buffer: no allocation).
func appendPAE(b []byte, typ string, body []byte) []byte {
	b = append(b, "DSSEv1 "...)
	b = strconv.AppendInt(b, int64(len(typ)), 10)
	b = append(append(append(b, ' '), typ...), ' ')
	b = strconv.AppendInt(b, int64(len(body)), 10)
	return append(append(b, ' '), body...)
}

// attr returns the value of a core attribute of a binary-mode message ("" unset).
func attr(h nats.Header, name string) string {
	key := "ce-" + name
	if name == "datacontenttype" {
		key = "Content-Type"
	}
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// extensions lists the extension attributes of h that a signer signs: every ce-*
// header that is no core attribute, dssematerial or signedextattrs, sorted.
func extensions(h nats.Header) []string { return appendExtensions(make([]string, 0, 8), h) }

// appendExtensions appends extensions(h) to out (a signer's stack array: no allocation).
func appendExtensions(out []string, h nats.Header) []string {
	for k := range h {
		name, ok := strings.CutPrefix(k, "ce-")
		if !ok || name == ExtMaterial || name == ExtSigned || slices.Contains(coreAttrs, name) {
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// signedList returns the extension attributes h says were signed (signedextattrs),
// checked against the extension's constraints.
func signedList(h nats.Header) ([]string, error) {
	v := attr(h, ExtSigned)
	if v == "" {
		return nil, nil
	}
	names := strings.Split(v, ",")
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || seen[n] || n == ExtMaterial || n == ExtSigned || slices.Contains(coreAttrs, n) {
			return nil, fmt.Errorf("%w: signedextattrs %q breaks the extension's constraints", ErrBadSignature, v)
		}
		seen[n] = true
	}
	return names, nil
}

// Material is the verification material of a binary-mode event (header h, data): the
// SHA-256 of the digests of its core attributes, its data and the extension
// attributes exts (name and value each), as the verifiability extension defines it.
// time is normalized to RFC 3339 in UTC (fraction kept, trailing zeros dropped).
func Material(h nats.Header, data []byte, exts []string) [32]byte {
	// Stack buffers: the digests, and each value's bytes (no allocation per attribute).
	var seqBuf [32 * 32]byte
	var valBuf [256]byte
	seq := seqBuf[:0]
	addString := func(v string) {
		d := sha256.Sum256(append(valBuf[:0], v...))
		seq = append(seq, d[:]...)
	}
	for _, a := range coreAttrs {
		v := attr(h, a)
		if a == "time" && v != "" {
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				// Formatted on the stack: v itself when it is already normal (the encoder's).
				var tb [64]byte
				if n := t.UTC().AppendFormat(tb[:0], time.RFC3339Nano); string(n) != v {
					v = string(n)
				}
			}
		}
		addString(v)
	}
	d := sha256.Sum256(data)
	seq = append(seq, d[:]...)
	for _, e := range exts {
		addString(e)
		addString(attr(h, e))
	}
	return sha256.Sum256(seq)
}

// Digest is the digest a child event names in prevdigest: the verification material of
// the event over the extension attributes it signed (every extension attribute of an
// unsigned one), as "sha256:<hex>".
func Digest(h nats.Header, data []byte) string {
	exts, err := signedList(h)
	if err != nil || attr(h, ExtSigned) == "" && attr(h, ExtMaterial) == "" {
		exts = extensions(h)
	}
	m := Material(h, data, exts)
	return DigestPrefix + hex.EncodeToString(m[:])
}

// Signer signs events with one ed25519 key.
type Signer struct {
	KeyID     string
	key       ed25519.PrivateKey
	keyIDJSON []byte // KeyID as a JSON string (envelope)
}

// NewSigner returns a signer of key, named keyID in the envelopes.
func NewSigner(keyID string, key ed25519.PrivateKey) *Signer {
	quoted, _ := json.Marshal(keyID) // a string always marshals
	return &Signer{KeyID: keyID, key: key, keyIDJSON: quoted}
}

// Public is the signer's public key.
func (s *Signer) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Sign signs the binary-mode event (h, data) in place: it sets signedextattrs to every
// extension attribute h carries, then dssematerial. prevdigest, when the event names
// one, must be set before.
//
// Its buffers are on the stack and both header values share one slice: signing is on
// every publish's path (allocations per op: go test -bench Sign ./events/seal/).
func (s *Signer) Sign(h nats.Header, data []byte) error {
	var extBuf [16]string
	exts := appendExtensions(extBuf[:0], h)
	vals := make([]string, 2) // signedextattrs, dssematerial
	if len(exts) > 0 {
		vals[0] = strings.Join(exts, ",")
		h[HeaderSigned] = vals[0:1:1]
	} else {
		delete(h, HeaderSigned)
	}
	m := Material(h, data, exts)
	var pae [128]byte // PAE of a 32-byte payload of PayloadType: 95 bytes
	var sig [ed25519.SignatureSize]byte
	copy(sig[:], ed25519.Sign(s.key, appendPAE(pae[:0], PayloadType, m[:])))
	vals[1] = s.envelope(m, sig[:])
	h[HeaderMaterial] = vals[1:2:2]
	return nil
}

// KeyFunc returns the public key of a key id (false: unknown).
type KeyFunc func(keyID string) (ed25519.PublicKey, bool)

// Verify checks the signature of the binary-mode event (h, data) with the keys of
// keys, following the extension's verification protocol, and returns the key id that
// signed it. ErrUnsigned: no dssematerial; ErrBadSignature: anything else wrong.
func Verify(h nats.Header, data []byte, keys KeyFunc) (string, error) {
	raw := attr(h, ExtMaterial)
	if raw == "" {
		return "", ErrUnsigned
	}
	b, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return "", fmt.Errorf("%w: dssematerial is not base64", ErrBadSignature)
	}
	var env Envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return "", fmt.Errorf("%w: dssematerial is no DSSE envelope", ErrBadSignature)
	}
	if env.PayloadType != PayloadType {
		return "", fmt.Errorf("%w: payload type %q", ErrBadSignature, env.PayloadType)
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil || len(payload) != 32 {
		return "", fmt.Errorf("%w: the payload is no 32-byte digest", ErrBadSignature)
	}
	var signer string
	for _, s := range env.Signatures {
		pub, ok := keys(s.KeyID)
		sig, err := base64.StdEncoding.DecodeString(s.Sig)
		if ok && err == nil && ed25519.Verify(pub, PAE(env.PayloadType, payload), sig) {
			signer = s.KeyID
			break
		}
	}
	if signer == "" {
		ids := make([]string, 0, len(env.Signatures))
		for _, s := range env.Signatures {
			ids = append(ids, s.KeyID)
		}
		return "", fmt.Errorf("%w: no signature verifies with a known key (key ids %s)", ErrBadSignature, strings.Join(ids, ", "))
	}
	exts, err := signedList(h)
	if err != nil {
		return signer, err
	}
	if m := Material(h, data, exts); string(m[:]) != string(payload) {
		return signer, fmt.Errorf("%w: signed by %s, but the event is not the one signed (attributes or data altered)", ErrBadSignature, signer)
	}
	return signer, nil
}
