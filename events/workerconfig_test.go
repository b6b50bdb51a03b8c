package events_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
)

// TestWorkerConfigValidate: zero values are valid (they mean the defaults); a value out
// of range is refused with an error naming the field and its valid range.
func TestWorkerConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  events.WorkerConfig
		want string // "" for valid
	}{
		{"zero: every default", events.WorkerConfig{}, ""},
		{"all set", events.WorkerConfig{Instance: "w", Concurrency: 1, AckWait: time.Second, MaxDeliver: 1, Grace: time.Millisecond}, ""},
		{"negative concurrency", events.WorkerConfig{Concurrency: -1}, "Concurrency -1: want 1 or more (0: default 64)"},
		{"negative ack wait", events.WorkerConfig{AckWait: -time.Second}, "AckWait -1s: want 1s or more (0: default 30s)"},
		{"ack wait under a second", events.WorkerConfig{AckWait: 999 * time.Millisecond}, "AckWait 999ms: want 1s or more"},
		{"negative max deliver", events.WorkerConfig{MaxDeliver: -2}, "MaxDeliver -2: want 1 or more (0: default 5)"},
		{"negative grace", events.WorkerConfig{Grace: -time.Second}, "Grace -1s: want 0s or more (0: default 30s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: nil, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %q, want it to contain %q", err, tc.want)
			}
			var ce *events.ConfigError
			if !errors.Is(err, events.ErrInvalidConfig) || !errors.As(err, &ce) || !strings.HasPrefix(tc.want, ce.Field+" ") {
				t.Errorf("Validate: %#v is not a ConfigError of the field named in %q wrapping ErrInvalidConfig", err, tc.want)
			}
		})
	}
}

// TestWorkerConfigWithDefaults: zero fields get the defaults, set ones are kept.
func TestWorkerConfigWithDefaults(t *testing.T) {
	got := events.WorkerConfig{}.WithDefaults("role")
	if got.Instance != "role" || got.Concurrency != events.DefaultConcurrency || got.AckWait != events.DefaultAckWait ||
		got.MaxDeliver != events.DefaultMaxDeliver || got.Grace != events.DefaultGrace || got.Logger == nil {
		t.Errorf("defaults: %+v", got)
	}
	set := events.WorkerConfig{Instance: "w", Concurrency: 3, AckWait: 2 * time.Second, MaxDeliver: 7, Grace: time.Second}
	kept := set.WithDefaults("role")
	kept.Logger = nil
	if kept != set {
		t.Errorf("set fields changed: %+v, want %+v", kept, set)
	}
}
