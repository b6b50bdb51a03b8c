package injector_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/injector"
)

// TestNewRefusesBadConfig: New returns the error of Validate, naming the field, instead
// of replacing a bad value with its default.
func TestNewRefusesBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  injector.Config
		want string // "" for accepted
	}{
		{"zero: every default", injector.Config{}, ""},
		{"negative concurrency", injector.Config{WorkerConfig: workerconfig.WorkerConfig{Concurrency: -1}}, "injector: invalid config: Concurrency -1"},
		{"negative grace", injector.Config{WorkerConfig: workerconfig.WorkerConfig{Grace: -time.Second}}, "injector: invalid config: Grace -1s"},
		{"negative deadline grace", injector.Config{DeadlineGrace: -time.Second}, "injector: invalid config: DeadlineGrace -1s: want 0s or more (0: default 2s)"},
		{"negative max timers", injector.Config{MaxTimers: -1}, "injector: invalid config: MaxTimers -1: want 1 or more (0: default 100000)"},
		{"negative default max steps", injector.Config{Defaults: toolbus.DefaultLimits{MaxSteps: -1}}, "injector: invalid config: Defaults.MaxSteps -1: want 1 or more (0: default 10)"},
		{"negative default run timeout", injector.Config{Defaults: toolbus.DefaultLimits{RunTimeout: -time.Minute}}, "injector: invalid config: Defaults.RunTimeout -1m0s"},
		{"negative default token budget", injector.Config{Defaults: toolbus.DefaultLimits{TokenBudget: -1}}, "injector: invalid config: Defaults.TokenBudget -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in, err := injector.New(nil, tc.cfg)
			if tc.want == "" {
				if err != nil || in == nil {
					t.Fatalf("New: %v, %v; want an injector", in, err)
				}
				return
			}
			if err == nil || in != nil || !errors.Is(err, workerconfig.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, %v; want nil and an ErrInvalidConfig containing %q", in, err, tc.want)
			}
		})
	}
}
