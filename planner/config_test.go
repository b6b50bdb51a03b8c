package planner_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/planner"
)

// TestNewRefusesBadConfig: New returns the error of Validate, naming the field, instead
// of replacing a bad value with its default.
func TestNewRefusesBadConfig(t *testing.T) {
	model := planner.ModelFunc(nil)
	cases := []struct {
		name string
		cfg  planner.Config
		want string // "" for accepted
	}{
		{"zero: every default", planner.Config{}, ""},
		{"negative concurrency", planner.Config{WorkerConfig: workerconfig.WorkerConfig{Concurrency: -4}}, "planner: invalid config: Concurrency -4"},
		{"ack wait under a second", planner.Config{WorkerConfig: workerconfig.WorkerConfig{AckWait: time.Millisecond}}, "planner: invalid config: AckWait 1ms"},
		{"negative model timeout", planner.Config{ModelTimeout: -time.Second}, "planner: invalid config: ModelTimeout -1s: want more than 0s (0: default 2m0s)"},
		{"negative max calls per step", planner.Config{MaxCallsPerStep: -1}, "planner: invalid config: MaxCallsPerStep -1: want 1 or more (0: default 128)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := planner.New(nil, model, nil, tc.cfg)
			if tc.want == "" {
				if err != nil || p == nil {
					t.Fatalf("New: %v, %v; want a planner", p, err)
				}
				return
			}
			if err == nil || p != nil || !errors.Is(err, workerconfig.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, %v; want nil and an ErrInvalidConfig containing %q", p, err, tc.want)
			}
		})
	}
}
