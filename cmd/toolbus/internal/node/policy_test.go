package node

import (
	"os"
	"slices"
	"testing"

	"github.com/kelseyhightower/envconfig"

	"github.com/toolbus/toolbus/injector"
)

// The injector's decision policy as the binary reads it: unset, anyone decides on the
// embedded server (its one process is one party) and only each run's principal and
// approvers on a shared server; TOOLBUS_DECIDERS names more, and * lets anyone.
func TestDecisionPolicyDefaults(t *testing.T) {
	const unset = "<unset>"
	for _, tc := range []struct {
		name, url, deciders string
		want                []string
	}{
		{"embedded, unset: anyone", "", unset, nil},
		{"embedded, set empty: principal and approvers", "", "", []string{}},
		{"shared server, unset: principal and approvers", "nats://bus:4222", unset, []string{}},
		{"shared server, listed operators", "nats://bus:4222", "ops,oncall", []string{"ops", "oncall"}},
		{"shared server, anyone", "nats://bus:4222", injector.AnyoneDecides, []string{injector.AnyoneDecides}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TOOLBUS_NATS_URL", tc.url)
			t.Setenv("TOOLBUS_DECIDERS", tc.deciders)
			if tc.deciders == unset {
				os.Unsetenv("TOOLBUS_DECIDERS") // t.Setenv restores it after the test
			}
			var cfg Config
			if err := envconfig.Process("toolbus", &cfg); err != nil {
				t.Fatal(err)
			}
			got := cfg.DecisionPolicy()
			if (got == nil) != (tc.want == nil) || !slices.Equal(got, tc.want) {
				t.Fatalf("DecisionPolicy() = %#v, want %#v", got, tc.want)
			}
		})
	}
}
