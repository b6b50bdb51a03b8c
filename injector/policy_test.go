package injector

import (
	"errors"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
)

// The decision policy: a run's principal, the approvers its start lists and the
// administrator's deciders may decide on and cancel it; nobody else, and never a
// decision naming no one, unless the deciders let anyone.
func TestDecisionPolicy(t *testing.T) {
	rs := toolbus.RunStarted{RunID: "r1", Principal: toolbus.Principal{ID: "bob"}, Approvers: []string{"alice"}}
	for _, tc := range []struct {
		name     string
		deciders []string
		who      string
		ok       bool
	}{
		{"the principal", []string{}, "bob", true},
		{"a listed approver", []string{}, "alice", true},
		{"an administrator's decider", []string{"ops"}, "ops", true},
		{"anyone else", []string{"ops"}, "mallory", false},
		{"no one named", []string{}, "", false},
		{"a padded principal is the principal", []string{}, " bob ", true},
		{"a prefix of the principal is not", []string{}, "bo", false},
		{"nil deciders: anyone", nil, "mallory", true},
		{"the wildcard: anyone", []string{"ops", AnyoneDecides}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := rs.CheckDecider(tc.deciders, tc.who)
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var nd *NotDeciderError
			if !errors.As(err, &nd) || nd.RunID != "r1" || nd.Principal != "bob" {
				t.Fatalf("err = %v, want a NotDeciderError for run r1 of bob", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "TOOLBUS_DECIDERS") || !strings.Contains(msg, `"bob"`) {
				t.Fatalf("the refusal does not say who may: %q", msg)
			}
		})
	}
}
