package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolbus/toolbus/events/store"
)

// QuietFigures are the quiet tenant's figures of one phase: the step with its one call
// (model.requested of step 0 to that of step 1) and its schedule-to-start (the call's
// tool.requested to its first claim), both from the times the server stored them.
type QuietFigures struct {
	Runs      int     `json:"runs"`
	StepP50MS float64 `json:"step_p50_ms"`
	StepP99MS float64 `json:"step_p99_ms"`
	S2SP50MS  float64 `json:"schedule_to_start_p50_ms"`
	S2SP99MS  float64 `json:"schedule_to_start_p99_ms"`
}

// TenantRow is one measurement of `toolbus bench -tenants` at one flood size: the quiet
// tenant alone and under the flood, the flood alone and beside the quiet tenant, and
// their ratios.
type TenantRow struct {
	FloodK     int `json:"flood_calls_per_step"`
	FloodSteps int `json:"flood_steps_with_calls"`
	FloodRuns  int `json:"flood_runs_in_flight"`
	ToolMS     int `json:"tool_ms"`
	// Repeat numbers the measurement (1..TenantOptions.Repeat); 0 for a median row.
	Repeat int `json:"repeat,omitempty"`

	QuietAlone QuietFigures `json:"quiet_alone"`
	QuietFlood QuietFigures `json:"quiet_under_flood"`
	// Flood throughput in calls finished per second (tool.finished of its runs, counted
	// as they arrive), alone and while the quiet tenant runs.
	FloodAloneCallsPS  float64 `json:"flood_alone_calls_per_s"`
	FloodBesideCallsPS float64 `json:"flood_beside_quiet_calls_per_s"`
	// FairSplit splits the quiet call's schedule-to-start under the flood (fair share
	// on; nil off).
	FairSplit *FairSplit `json:"quiet_under_flood_fair_split,omitempty"`
	// FloodFailed counts the flood's runs that ended otherwise than completed (a start
	// refused by the quota shows here).
	FloodFailed int `json:"flood_runs_failed"`

	// Ratios: quiet under flood over quiet alone; flood beside quiet over flood alone.
	StepP50X  float64 `json:"quiet_step_p50_x"`
	StepP99X  float64 `json:"quiet_step_p99_x"`
	S2SP50X   float64 `json:"quiet_schedule_to_start_p50_x"`
	S2SP99X   float64 `json:"quiet_schedule_to_start_p99_x"`
	FloodKeep float64 `json:"flood_beside_over_alone"`
}

// quietSample measures one quiet run from what the server stored of it (its events and
// its claims, in store order): its step with calls and its one call's schedule-to-start.
func quietSample(run string, msgs []stored) (step, s2s time.Duration, err error) {
	var reqs []time.Time
	var requested, claimed time.Time
	for _, m := range msgs {
		switch {
		case strings.HasSuffix(m.subject, ".model.requested"):
			reqs = append(reqs, m.at)
		case strings.Contains(m.subject, ".tool.requested.") && requested.IsZero():
			requested = m.at
		case strings.HasPrefix(m.subject, "$KV."+store.BucketClaims+".") && claimed.IsZero():
			claimed = m.at
		}
	}
	if len(reqs) < 2 || requested.IsZero() || claimed.IsZero() {
		return 0, 0, fmt.Errorf("bench tenants: run %s: %d model.requested, tool.requested %v, claim %v stored; want 2, a call and its claim",
			run, len(reqs), !requested.IsZero(), !claimed.IsZero())
	}
	return reqs[1].Sub(reqs[0]), claimed.Sub(requested), nil
}

// quietFigures are the percentiles of a phase's samples.
func quietFigures(steps, s2s []time.Duration) QuietFigures {
	return QuietFigures{Runs: len(steps), StepP50MS: pct(steps, 50), StepP99MS: pct(steps, 99), S2SP50MS: pct(s2s, 50), S2SP99MS: pct(s2s, 99)}
}

// ratio is a/b, 0 when b is.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// setRatios computes the row's ratios from its figures.
func (r *TenantRow) setRatios() {
	r.StepP50X = ratio(r.QuietFlood.StepP50MS, r.QuietAlone.StepP50MS)
	r.StepP99X = ratio(r.QuietFlood.StepP99MS, r.QuietAlone.StepP99MS)
	r.S2SP50X = ratio(r.QuietFlood.S2SP50MS, r.QuietAlone.S2SP50MS)
	r.S2SP99X = ratio(r.QuietFlood.S2SP99MS, r.QuietAlone.S2SP99MS)
	r.FloodKeep = ratio(r.FloodBesideCallsPS, r.FloodAloneCallsPS)
}

// median is the median of v (the mean of the middle two when even).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// MedianRows gives, per flood size measured more than once, the median of each figure
// over its measurements, and the ratios of those medians: on a shared machine one
// measurement is noise.
func MedianRows(rows []TenantRow) []TenantRow {
	var out []TenantRow
	for _, k := range orderedKs(rows) {
		var same []TenantRow
		for _, r := range rows {
			if r.FloodK == k {
				same = append(same, r)
			}
		}
		if len(same) < 2 {
			continue
		}
		med := func(f func(TenantRow) float64) float64 {
			v := make([]float64, len(same))
			for i, r := range same {
				v[i] = f(r)
			}
			return median(v)
		}
		m := TenantRow{FloodK: k, FloodSteps: same[0].FloodSteps, FloodRuns: same[0].FloodRuns, ToolMS: same[0].ToolMS}
		for _, ph := range []struct {
			dst *QuietFigures
			src func(TenantRow) QuietFigures
		}{{&m.QuietAlone, func(r TenantRow) QuietFigures { return r.QuietAlone }}, {&m.QuietFlood, func(r TenantRow) QuietFigures { return r.QuietFlood }}} {
			*ph.dst = QuietFigures{
				Runs:      int(med(func(r TenantRow) float64 { return float64(ph.src(r).Runs) })),
				StepP50MS: med(func(r TenantRow) float64 { return ph.src(r).StepP50MS }),
				StepP99MS: med(func(r TenantRow) float64 { return ph.src(r).StepP99MS }),
				S2SP50MS:  med(func(r TenantRow) float64 { return ph.src(r).S2SP50MS }),
				S2SP99MS:  med(func(r TenantRow) float64 { return ph.src(r).S2SP99MS }),
			}
		}
		m.FloodAloneCallsPS = med(func(r TenantRow) float64 { return r.FloodAloneCallsPS })
		m.FloodBesideCallsPS = med(func(r TenantRow) float64 { return r.FloodBesideCallsPS })
		for _, r := range same {
			m.FloodFailed += r.FloodFailed
		}
		m.setRatios()
		out = append(out, m)
	}
	return out
}

// orderedKs are the flood sizes of rows, in their first order.
func orderedKs(rows []TenantRow) []int {
	var ks []int
	for _, r := range rows {
		if !slices.Contains(ks, r.FloodK) {
			ks = append(ks, r.FloodK)
		}
	}
	return ks
}

// PrintTenants writes the report as a table: a line per figure, per flood size a
// column alone, one beside the other tenant, and their ratio. With several
// measurements of a size, only their medians are shown (each one is in the JSON).
func PrintTenants(out io.Writer, rep TenantReport) {
	rows := rep.Medians
	label := fmt.Sprintf("median of %d", max(1, rep.Options.Repeat))
	if len(rows) == 0 {
		rows, label = rep.Rows, "one measurement"
	}
	if len(rows) == 0 {
		return
	}
	o := rep.Options
	fmt.Fprintf(out, "fair share between tenants (%s; server store times): quiet = principal %q, %d sequential runs of one %s call of %d ms;\n",
		label, QuietPrincipal, o.QuietRuns, TenantTool, o.ToolMS)
	fmt.Fprintf(out, "flood = principal %q, %d runs in flight (TOOLBUS_MAX_RUNS_IN_FLIGHT) of %d steps of K parallel calls; %d executor process(es), concurrency %s\n",
		FloodPrincipal, o.Quota, o.FloodSteps, o.Executors, concurrencyName(o.Concurrency))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "tenants\t"
	for _, r := range rows {
		head += fmt.Sprintf("K=%d alone\tunder flood\tx\t", r.FloodK)
	}
	fmt.Fprintln(tw, head)
	line := func(name string, f func(TenantRow) (alone, beside, x float64)) {
		cells := name + "\t"
		for _, r := range rows {
			a, b, x := f(r)
			cells += fmt.Sprintf("%.1f\t%.1f\t%.2f\t", a, b, x)
		}
		fmt.Fprintln(tw, cells)
	}
	line("quiet step p50 ms", func(r TenantRow) (float64, float64, float64) {
		return r.QuietAlone.StepP50MS, r.QuietFlood.StepP50MS, r.StepP50X
	})
	line("quiet step p99 ms", func(r TenantRow) (float64, float64, float64) {
		return r.QuietAlone.StepP99MS, r.QuietFlood.StepP99MS, r.StepP99X
	})
	line("quiet schedule-to-start p50 ms", func(r TenantRow) (float64, float64, float64) {
		return r.QuietAlone.S2SP50MS, r.QuietFlood.S2SP50MS, r.S2SP50X
	})
	line("quiet schedule-to-start p99 ms", func(r TenantRow) (float64, float64, float64) {
		return r.QuietAlone.S2SP99MS, r.QuietFlood.S2SP99MS, r.S2SP99X
	})
	line("flood calls/s (alone, beside quiet)", func(r TenantRow) (float64, float64, float64) {
		return r.FloodAloneCallsPS, r.FloodBesideCallsPS, r.FloodKeep
	})
	tw.Flush()
	for _, r := range rows {
		if f := r.FairSplit; f != nil {
			fmt.Fprintf(out, "K=%d: the quiet call under the flood, p50 ms: requested to staged %.1f, staged to released %.1f, released to claimed %.1f\n",
				r.FloodK, f.StagedP50MS, f.ReleasedP50MS, f.ClaimedP50MS)
		}
		if r.FloodFailed > 0 {
			fmt.Fprintf(out, "K=%d: %d flood runs did not complete (quota refusals or failures)\n", r.FloodK, r.FloodFailed)
		}
	}
	fmt.Fprintln(out, "schedule-to-start: the call's tool.requested to the executor's claim of it, as the server stored both")
}

// concurrencyName is the executor concurrency as set (0: the default).
func concurrencyName(c int) string {
	if c == 0 {
		return "as the environment sets it (TOOLBUS_CONCURRENCY, default 64)"
	}
	return fmt.Sprintf("%d (TOOLBUS_CONCURRENCY)", c)
}
