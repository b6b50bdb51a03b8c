package events

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events/seal"
)

// Signed and chained events (CONTRACT.md, "Signed and chained events"; package seal):
// with a signing key, every event a bus publishes names the event its handler was
// handling (prevdigest, from the context: seal.WithParent, which the consumers'
// dispatch sets) and is signed by this process's signer. Both are ce-* attributes of the
// message itself: no message is added.

// withSigner loads the signing key of the bus's Config (none: the bus signs nothing).
func withSigner(b *Bus, err error) (*Bus, error) {
	if err != nil || b.cfg.SigningKey == "" {
		return b, err
	}
	s, err := seal.LoadSigner(b.cfg.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("events: TOOLBUS_SIGNING_KEY: %w", err)
	}
	b.signer.Store(s)
	return b, nil
}

// SetSigner makes the bus sign every event it publishes with s (nil: unsigned), also
// while it publishes (a key rotated in a running process).
func (b *Bus) SetSigner(s *seal.Signer) { b.signer.Store(s) }

// Signer is the bus's signer (nil: it signs nothing).
func (b *Bus) Signer() *seal.Signer { return b.signer.Load() }

// encode builds the message of one event as every publish of the bus sends it: Encode,
// the trace of ctx (the span of ctx parents the consumer's; no-op untraced), the event
// it follows and the signature.
func (b *Bus) encode(ctx context.Context, subject string, m Meta, data any) (*nats.Msg, error) {
	msg, err := Encode(subject, m, data)
	if err != nil {
		return nil, err
	}
	InjectTrace(ctx, msg.Header)
	if err := b.seal(ctx, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// seal names the parent of ctx in msg and signs it. Without a signer it does neither:
// an unsigned event's chain proves nothing (a verifier reports its run unsigned), so
// the parent's digest is computed only where it is signed, once per handled message
// (seal.ParentDigest).
func (b *Bus) seal(ctx context.Context, msg *nats.Msg) error {
	signer := b.signer.Load()
	if signer == nil {
		return nil
	}
	if d := seal.ParentDigest(ctx); d != "" {
		msg.Header[seal.HeaderPrevDigest] = []string{d}
	}
	if err := signer.Sign(msg.Header, msg.Data); err != nil {
		return fmt.Errorf("events: sign %s: %w", msg.Header.Get("ce-id"), err)
	}
	return nil
}
