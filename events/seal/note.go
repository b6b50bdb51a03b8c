package seal

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
)

// NoteSigner signs signed notes (golang.org/x/mod/sumdb/note, C2SP signed-note) with
// the signer's key, named by its key id: the core signs its stream checkpoints with the
// key it signs its events with, so a verifier finds both in one keyring.
type NoteSigner struct{ s *Signer }

// NoteSigner returns the signer as a signed-note signer.
func (s *Signer) NoteSigner() NoteSigner { return NoteSigner{s} }

// Name is the key id.
func (n NoteSigner) Name() string { return n.s.KeyID }

// KeyHash is the signed-note key hash of an Ed25519 key: the first four bytes of
// SHA-256(name "\n" 0x01 public key), big-endian.
func (n NoteSigner) KeyHash() uint32 {
	h := sha256.New()
	h.Write([]byte(n.s.KeyID + "\n"))
	h.Write(append([]byte{1}, n.s.Public()...))
	return binary.BigEndian.Uint32(h.Sum(nil))
}

// Sign signs msg with ed25519.
func (n NoteSigner) Sign(msg []byte) ([]byte, error) { return ed25519.Sign(n.s.key, msg), nil }
