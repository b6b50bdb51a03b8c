package workerconfig_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/workerconfig"
)

// TestWorkerConfigValidate: zero values are valid (they mean the defaults); a value out
// of range is refused with an error naming the field and its valid range.
func TestWorkerConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  workerconfig.WorkerConfig
		want string // "" for valid
	}{
		{"zero: every default", workerconfig.WorkerConfig{}, ""},
		{"all set", workerconfig.WorkerConfig{Instance: "w", Concurrency: 1, AckWait: time.Second, MaxDeliver: 1, Grace: time.Millisecond}, ""},
		{"negative concurrency", workerconfig.WorkerConfig{Concurrency: -1}, "Concurrency -1: want 1 or more (0: default 64)"},
		{"negative ack wait", workerconfig.WorkerConfig{AckWait: -time.Second}, "AckWait -1s: want 1s or more (0: default 30s)"},
		{"ack wait under a second", workerconfig.WorkerConfig{AckWait: 999 * time.Millisecond}, "AckWait 999ms: want 1s or more"},
		{"negative max deliver", workerconfig.WorkerConfig{MaxDeliver: -2}, "MaxDeliver -2: want 1 or more (0: default 5)"},
		{"negative grace", workerconfig.WorkerConfig{Grace: -time.Second}, "Grace -1s: want 0s or more (0: default 30s)"},
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
			var ce *workerconfig.ConfigError
			if !errors.Is(err, workerconfig.ErrInvalidConfig) || !errors.As(err, &ce) || !strings.HasPrefix(tc.want, ce.Field+" ") {
				t.Errorf("Validate: %#v is not a ConfigError of the field named in %q wrapping ErrInvalidConfig", err, tc.want)
			}
		})
	}
}

// TestWorkerConfigWithDefaults: zero fields get the defaults, set ones are kept.
func TestWorkerConfigWithDefaults(t *testing.T) {
	got := workerconfig.WorkerConfig{}.WithDefaults("role")
	if got.Instance != "role" || got.Concurrency != workerconfig.DefaultConcurrency || got.AckWait != workerconfig.DefaultAckWait ||
		got.MaxDeliver != workerconfig.DefaultMaxDeliver || got.Grace != workerconfig.DefaultGrace || got.Logger == nil {
		t.Errorf("defaults: %+v", got)
	}
	set := workerconfig.WorkerConfig{Instance: "w", Concurrency: 3, AckWait: 2 * time.Second, MaxDeliver: 7, Grace: time.Second}
	kept := set.WithDefaults("role")
	kept.Logger = nil
	if kept != set {
		t.Errorf("set fields changed: %+v, want %+v", kept, set)
	}
}

// TestQueueAckWait: a tool's queue waits the executors' AckWait, but no longer than
// their lease (the instance TTL), and never under MinAckWait; zero values are the
// defaults (30 s and 5 s: the queue waits 5 s).
func TestQueueAckWait(t *testing.T) {
	for _, tc := range []struct {
		ackWait, ttl, want time.Duration
	}{
		{0, 0, events.DefaultInstanceTTL},
		{0, 2 * time.Second, 2 * time.Second},
		{2 * time.Second, 10 * time.Second, 2 * time.Second},
		{30 * time.Second, time.Minute, 30 * time.Second},
		{30 * time.Second, 100 * time.Millisecond, workerconfig.MinAckWait},
	} {
		if got := workerconfig.QueueAckWait(tc.ackWait, tc.ttl); got != tc.want {
			t.Errorf("QueueAckWait(%v, %v) = %v, want %v", tc.ackWait, tc.ttl, got, tc.want)
		}
	}
}
