package worker_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/internal/testutil"
)

// TestNewRefusesBadConfig: New returns the error of Validate, naming the field, instead
// of replacing a bad value with its default.
func TestNewRefusesBadConfig(t *testing.T) {
	exec := testutil.Must(executor.New(executor.NewRegistry()))
	bus := eventstest.Setup(t, events.Config{Memory: true})
	cases := []struct {
		name string
		cfg  worker.Config
		want string // "" for accepted
	}{
		{"zero: every default", worker.Config{}, ""},
		{"no fleet bound", worker.Config{RunMaxInFlight: -1}, ""},
		{"negative concurrency", worker.Config{WorkerConfig: workerconfig.WorkerConfig{Concurrency: -1}}, "executor: invalid config: Concurrency -1"},
		{"negative max deliver", worker.Config{WorkerConfig: workerconfig.WorkerConfig{MaxDeliver: -1}}, "executor: invalid config: MaxDeliver -1"},
		{"negative max ack pending", worker.Config{MaxAckPending: -1}, "executor: invalid config: MaxAckPending -1: want 1 or more (0: default 1000)"},
		{"negative inline output max", worker.Config{InlineOutputMax: -1}, "executor: invalid config: InlineOutputMax -1: want 1 or more (0: default 262144)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := worker.New(bus, exec, tc.cfg)
			if tc.want == "" {
				if err != nil || w == nil {
					t.Fatalf("New: %v, %v; want a worker", w, err)
				}
				return
			}
			if err == nil || w != nil || !errors.Is(err, workerconfig.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, %v; want nil and an ErrInvalidConfig containing %q", w, err, tc.want)
			}
		})
	}
}

// TestLoadEnvOperations: Serve reads the binary's logging and metrics settings and
// refuses values the binary refuses.
func TestLoadEnvOperations(t *testing.T) {
	t.Setenv("TOOLBUS_METRICS_ADDR", "127.0.0.1:9464")
	t.Setenv("TOOLBUS_LOG_LEVEL", "debug")
	t.Setenv("TOOLBUS_LOG_FORMAT", "json")
	cfg, err := worker.LoadEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MetricsAddr != "127.0.0.1:9464" || cfg.LogLevel != "debug" || cfg.LogFormat != "json" {
		t.Fatalf("LoadEnv = %+v", cfg)
	}
	for env, bad := range map[string]string{"TOOLBUS_LOG_LEVEL": "loud", "TOOLBUS_LOG_FORMAT": "xml"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, bad)
			if _, err := worker.LoadEnv(); err == nil || !strings.Contains(err.Error(), env) {
				t.Fatalf("LoadEnv with %s=%s: %v, want an error naming it", env, bad, err)
			}
		})
	}
}
