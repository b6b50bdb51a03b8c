package checkpoint

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/toolbus/toolbus/events/seal"
)

// Checkpoint is a signed tree head: the origin (toolbus/<stream>), the number of
// leaves and the root hash.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
}

// Origin is the origin line of a stream's checkpoints.
func Origin(stream string) string { return "toolbus/" + stream }

// Text is the checkpoint body of C2SP tlog-checkpoint: origin, size, base64 root.
func (c Checkpoint) Text() string { return fmt.Sprintf("%s\n%d\n%s\n", c.Origin, c.Size, c.Root) }

// Sign signs the checkpoint as a signed note.
func (c Checkpoint) Sign(s *seal.Signer) (string, error) {
	b, err := note.Sign(&note.Note{Text: c.Text()}, s.NoteSigner())
	if err != nil {
		return "", fmt.Errorf("checkpoint: sign: %w", err)
	}
	return string(b), nil
}

// ErrCheckpoint is wrapped by every error of a checkpoint that does not verify.
var ErrCheckpoint = errors.New("checkpoint")

// Open verifies a signed checkpoint with the keys of ring: a signature by a core role
// key (role.*) not revoked. It returns the checkpoint and the key id that signed it.
func Open(signed string, ring seal.Keyring) (Checkpoint, string, error) {
	var vs []note.Verifier
	for _, k := range ring.Keys {
		if k.Kind() != seal.KindRole || !k.Revoked.IsZero() {
			continue
		}
		vkey, err := note.NewEd25519VerifierKey(k.KeyID, k.Public)
		if err != nil {
			continue
		}
		if v, err := note.NewVerifier(vkey); err == nil {
			vs = append(vs, v)
		}
	}
	n, err := note.Open([]byte(signed), note.VerifierList(vs...))
	if err != nil {
		return Checkpoint{}, "", fmt.Errorf("%w: signature: %w (no signature by a core key of the keyring verifies)", ErrCheckpoint, err)
	}
	c, err := parse(n.Text)
	if err != nil {
		return c, "", err
	}
	return c, n.Sigs[0].Name, nil
}

// parse reads a checkpoint body (extension lines after the root are allowed).
func parse(text string) (Checkpoint, error) {
	lines := strings.SplitN(text, "\n", 4)
	if len(lines) < 4 {
		return Checkpoint{}, fmt.Errorf("%w: the body has no origin, size and root", ErrCheckpoint)
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 {
		return Checkpoint{}, fmt.Errorf("%w: size %q", ErrCheckpoint, lines[1])
	}
	root, err := tlog.ParseHash(lines[2])
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: root %q", ErrCheckpoint, lines[2])
	}
	return Checkpoint{Origin: lines[0], Size: size, Root: root}, nil
}
