package planner_test

import (
	"errors"
	"testing"

	"github.com/toolbus/toolbus/planner"
)

// TestPermanent: the mark makes errors.Is find ErrPermanent and adds no text to the
// message, which ends up in RunEnded.Reason; marking twice changes nothing.
func TestPermanent(t *testing.T) {
	base := &planner.ProviderError{Provider: "openai", Status: 400, Message: "bad request body"}
	cases := []struct {
		name string
		err  error
	}{
		{"once", planner.Permanent(base)},
		{"twice", planner.Permanent(planner.Permanent(base))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !errors.Is(c.err, planner.ErrPermanent) {
				t.Fatalf("%v is not ErrPermanent", c.err)
			}
			var pe *planner.ProviderError
			if !errors.As(c.err, &pe) || pe != base {
				t.Fatalf("%v does not unwrap to the provider error", c.err)
			}
			if got, want := c.err.Error(), "openai: 400 Bad Request: bad request body"; got != want {
				t.Fatalf("message %q, want %q", got, want)
			}
		})
	}
	if planner.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) is not nil")
	}
	if errors.Is(base, planner.ErrPermanent) {
		t.Fatal("an unmarked error is ErrPermanent")
	}
}
