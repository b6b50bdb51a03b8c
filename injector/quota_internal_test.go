package injector

import (
	"context"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
)

// TestQuotaStartsPerSecond: a principal's starts beyond its rate (one per 100 s here, in
// bursts of one) are refused with a reason naming the bound; another principal's start
// is admitted meanwhile; a redelivered run.started of an admitted run is admitted again
// (it counts once); a negative bound is refused by Validate.
func TestQuotaStartsPerSecond(t *testing.T) {
	a := newAdmission(Quota{StartsPerSecond: 0.01, MaxRunsInFlight: 5})
	never := func(context.Context, string) (bool, error) { return false, nil }
	start := func(run, who string) string {
		t.Helper()
		why, err := a.admit(context.Background(), toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: who}}, never)
		if err != nil {
			t.Fatal(err)
		}
		return why
	}
	for _, c := range []struct {
		run, who, refused string
	}{
		{"m-1", "mallory", ""},
		{"m-1", "mallory", ""}, // redelivered
		{"m-2", "mallory", "principal mallory starts more than 0.01 runs per second (TOOLBUS_STARTS_PER_SECOND)"},
		{"a-1", "alice", ""},
		{"n-1", "", ""},
		{"n-2", "", "principal (none) starts more than"},
	} {
		why := start(c.run, c.who)
		if c.refused == "" && why != "" || c.refused != "" && !strings.Contains(why, c.refused) {
			t.Errorf("start %s of %q: refused %q, want %q", c.run, c.who, why, c.refused)
		}
	}
	for _, q := range []Quota{{MaxRunsInFlight: -1}, {StartsPerSecond: -1}, {MaxStartBytes: -1}} {
		if (Config{Quota: q}).Validate() == nil {
			t.Errorf("quota %+v accepted", q)
		}
	}
}
