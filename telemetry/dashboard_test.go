package telemetry_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/telemetry"
)

// *Metrics is what the workers record to.
var (
	_ worker.Metrics   = (*telemetry.Metrics)(nil)
	_ planner.Metrics  = (*telemetry.Metrics)(nil)
	_ injector.Metrics = (*telemetry.Metrics)(nil)
)

// exported returns the names of every metric a process exports, from the descriptors of
// its registry (a vector with no series yet is still described).
func exported(t *testing.T) map[string]bool {
	t.Helper()
	m := telemetry.New()
	m.WatchQueues(nil, 0, nil) // Describe does not touch the bus
	ch := make(chan *prometheus.Desc, 1000)
	m.Registry().Describe(ch)
	close(ch)
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range ch {
		if s := fq.FindStringSubmatch(d.String()); s != nil {
			names[s[1]] = true
		}
	}
	if len(names) < 10 {
		t.Fatalf("only %d metrics described: %v", len(names), names)
	}
	return names
}

// metricRef matches the metric names a PromQL query may use from toolbus processes.
var metricRef = regexp.MustCompile(`\b(?:toolbus|go|process)_[a-zA-Z0-9_]+`)

// The Grafana dashboard queries only metrics the code exports (a histogram's _bucket,
// _sum and _count series included): a renamed metric fails here, not on a blank panel.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	names := exported(t)
	raw, err := os.ReadFile("../deploy/grafana/dashboards/toolbus.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	queried := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			refs := metricRef.FindAllString(tg.Expr, -1)
			if len(refs) == 0 {
				t.Errorf("panel %q: query %q names no toolbus metric", p.Title, tg.Expr)
			}
			for _, ref := range refs {
				base := ref
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(ref, suffix); ok && names[b] {
						base = b
					}
				}
				if !names[base] {
					t.Errorf("panel %q queries %s, which the code does not export", p.Title, ref)
				}
				queried[base] = true
			}
		}
	}
	// Every toolbus metric has a panel.
	for n := range names {
		if strings.HasPrefix(n, "toolbus_") && !queried[n] {
			t.Errorf("no panel shows %s", n)
		}
	}
}
