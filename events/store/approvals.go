package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
)

// Call ids are unique within a step only (some models reuse call_0 at every step), so
// approval decisions are kept per step: a decision never carries over to a later call
// that happens to reuse the id.
func decisionKey(run string, step int, callID string) string {
	return run + "." + strconv.Itoa(step) + "." + kvSafe(callID)
}

// DecideStep records the approval decision of one call of a step; the first decision
// stands and is returned.
func (s *Store) DecideStep(ctx context.Context, step int, d Decision) (Decision, error) {
	key := decisionKey(d.RunID, step, d.CallID)
	if _, err := s.approvals.Create(ctx, key, mustJSON(d)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return d, fmt.Errorf("store: approval %s: %w", key, err)
		}
		return s.StepDecision(ctx, d.RunID, step, d.CallID)
	}
	return d, nil
}

// StepDecision returns the approval decision of one call of a step; ErrNotFound when
// none was made.
func (s *Store) StepDecision(ctx context.Context, run string, step int, callID string) (Decision, error) {
	var d Decision
	err := s.getJSON(ctx, s.approvals, decisionKey(run, step, callID), &d)
	return d, err
}

// Decision is a recorded approval decision for one call.
type Decision struct {
	toolbus.Approval
	Granted bool `json:"granted"`
}
