package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/internal/refusal"
)

// NoTeam is the team token of the secrets of an executor with no team (TOOLBUS_TEAM
// unset).
const NoTeam = "_shared"

// SecretKey is the key of a team's secret name in BucketSecrets: <team>.<name>, or
// _shared.<name> without a team. The team token comes first so that a team's
// credentials may be given its own keys only ($KV.toolbus_secrets.<team>.>, and the
// direct gets of $KV.toolbus_secrets.<team>.>). name must be key-safe (a hash).
func SecretKey(team, name string) string {
	if team == "" {
		team = NoTeam
	}
	return team + "." + kvSafe(name)
}

// Secrets are one team's keys of BucketSecrets, read and written with compare-and-set.
// The values are secrets: no method logs or wraps them in an error.
type Secrets struct {
	kv   jetstream.KeyValue
	team string
	// Guard, when set, bounds each operation by the server's permission violations
	// (events.Bus.Guard): credentials without the grant fail at once, not on a timeout.
	Guard func(context.Context) (context.Context, func(error) error)
}

func (s *Secrets) guard(ctx context.Context) (context.Context, func(error) error) {
	if s.Guard == nil {
		return ctx, func(err error) error { return err }
	}
	return s.Guard(ctx)
}

// NewSecrets returns the secrets of team (""; NoTeam) in kv, a handle on BucketSecrets
// (jetstream's, or NewDirectKV's in a team account).
func NewSecrets(kv jetstream.KeyValue, team string) *Secrets { return &Secrets{kv: kv, team: team} }

// Load returns the value of the secret name and its revision; nil and 0 when there is
// none.
func (s *Secrets) Load(ctx context.Context, name string) ([]byte, uint64, error) {
	ctx, done := s.guard(ctx)
	e, err := s.kv.Get(ctx, SecretKey(s.team, name))
	err = done(err)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("store: secret %s: %w", name, err)
	}
	return e.Value(), e.Revision(), nil
}

// Swap writes value as the secret name if its revision is still rev (0: if there is
// none) and returns the new revision; swapped is false when another writer came first
// (reload and decide again).
func (s *Secrets) Swap(ctx context.Context, name string, value []byte, rev uint64) (_ uint64, swapped bool, _ error) {
	key := SecretKey(s.team, name)
	var (
		n   uint64
		err error
	)
	ctx, done := s.guard(ctx)
	if rev == 0 {
		n, err = s.kv.Create(ctx, key, value)
	} else {
		n, err = s.kv.Update(ctx, key, value, rev)
	}
	err = done(err)
	if err == nil {
		return n, true, nil
	}
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)) {
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("store: write secret %s: %w", name, refusal.Wrap(err))
}
