package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/internal/golden"
)

// quietSample takes a quiet run's step from its two model.requested and its
// schedule-to-start from its tool.requested and the first claim, as stored; a run
// missing one of them is an error, not a zero.
func TestQuietSample(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	events := []stored{
		{at(0), "toolbus.q1.run.started.quiet"},
		{at(1), "toolbus.q1.model.requested"},
		{at(3), "toolbus.q1.model.responded"},
		{at(4), "toolbus.q1.tool.requested.sleep"},
		{at(205), "toolbus.q1.tool.finished.sleep"},
		{at(207), "toolbus.q1.model.requested"},
		{at(209), "toolbus.q1.run.completed"},
	}
	claims := []stored{{at(6.5), "$KV.toolbus_claims.sleep.q1.0.call_0_0"}, {at(150), "$KV.toolbus_claims.sleep.q1.0.call_0_0"}}
	step, s2s, err := quietSample("q1", append(events, claims...))
	if err != nil {
		t.Fatal(err)
	}
	if step != 206*time.Millisecond || s2s != 2500*time.Microsecond {
		t.Fatalf("step %v, schedule-to-start %v; want 206ms, 2.5ms", step, s2s)
	}
	if _, _, err := quietSample("q1", events); err == nil || !strings.Contains(err.Error(), "claim false") {
		t.Fatalf("no claim: %v", err)
	}
}

// The table and the medians of a report with two flood sizes measured three times
// (TestTenantTable -update rewrites testdata/tenants.golden).
func TestTenantTable(t *testing.T) {
	var rows []TenantRow
	for rep := 1; rep <= 3; rep++ {
		for _, k := range []int{16, 8} {
			f := float64(rep) + float64(k)/8
			r := TenantRow{FloodK: k, FloodSteps: 3, FloodRuns: 16, ToolMS: 200, Repeat: rep,
				QuietAlone:        QuietFigures{Runs: 30, StepP50MS: 205 + f, StepP99MS: 230 + 2*f, S2SP50MS: 1.5 * f, S2SP99MS: 6 * f},
				QuietFlood:        QuietFigures{Runs: 30, StepP50MS: 300 + 25*float64(k)*f, StepP99MS: 400 + 30*float64(k)*f, S2SP50MS: 40 * float64(k) * f, S2SP99MS: 60 * float64(k) * f},
				FloodAloneCallsPS: 320 - f, FloodBesideCallsPS: 310 - 2*f}
			if rep == 2 && k == 16 {
				r.FloodFailed = 2
			}
			r.setRatios()
			rows = append(rows, r)
		}
	}
	rep := TenantReport{Options: TenantOptions{FloodK: []int{16, 8}, FloodSteps: 3, Quota: 16, QuietRuns: 30, ToolMS: 200, Executors: 1, Repeat: 3},
		Rows: rows, Medians: MedianRows(rows)}
	var out bytes.Buffer
	PrintTenants(&out, rep)
	b, _ := json.MarshalIndent(rep.Medians, "", "  ")
	fmt.Fprintf(&out, "\nmedians as JSON:\n%s\n", b)
	golden.Check(t, "testdata/tenants.golden", out.Bytes())
	// One measurement a size: the rows themselves, no medians.
	if m := MedianRows(rows[:2]); len(m) != 0 {
		t.Fatalf("medians of single measurements: %+v", m)
	}
}
