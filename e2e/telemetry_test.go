package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/telemetry"
)

// A scripted run through the three roles, each reporting to one telemetry.Metrics as
// `toolbus up` does: /readyz answers 503 until every role's consumers are bound, then
// 200; /metrics then holds the run's calls by tool, status and code, the duration
// histograms, the model's latency and tokens, the step joins and the run's outcome.
func TestMetricsAfterAScriptedRun(t *testing.T) {
	t.Parallel()
	script := &planner.Script{Steps: []func(planner.Request) planner.Response{
		planner.Calls(call("a", "noop", `{}`), call("b", "noop", `{}`), call("c", "fail", `{}`)),
		planner.Answer("done"),
	}}
	s := newStack(t, planner.ModelFunc(func(ctx context.Context, req planner.Request) (planner.Response, error) {
		resp, err := script.Complete(ctx, req)
		resp.Usage = toolbus.Usage{InputTokens: 10, OutputTokens: 3}
		return resp, err
	}))
	m := telemetry.New()
	m.WatchQueues(s.bus, 10*time.Second, s.log)
	srv := httptest.NewServer(m.Handler(s.bus.Conn().IsConnected))
	t.Cleanup(srv.Close)

	// Registered roles that do not serve yet: not ready.
	for _, role := range []string{"executor", "planner", "injector"} {
		m.Observer(role)
	}
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the consumers are bound: %d %q, want 503", code, body)
	}
	if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d, want 200", code)
	}

	exec := must(executor.New(s.reg, executor.WithLogger(s.log), executor.WithInstance("executor-m")))
	w := must(worker.New(s.bus, exec, worker.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "executor-m", Logger: s.log, Grace: time.Second}, Metrics: m, Observer: m.Observer("executor")}))
	s.start("executor-m", w.Run)
	cat, err := s.bus.Store().WatchCatalog(s.ctx, s.log)
	if err != nil {
		t.Fatal(err)
	}
	p := must(planner.New(s.bus, s.model, cat, planner.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "planner-m", Logger: s.log, Grace: time.Second}, Metrics: m, Observer: m.Observer("planner")}))
	s.start("planner-m", p.Run)

	// Two of three roles serve: still not ready.
	eventstest.Eventually(t, 60*time.Second, func() error {
		if _, notReady := m.Ready(); len(notReady) != 1 || notReady[0] != "injector" {
			return fmt.Errorf("roles not ready: %v, want only the injector", notReady)
		}
		return nil
	})
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "injector") {
		t.Fatalf("/readyz without the injector: %d %q, want 503 naming the injector", code, body)
	}

	in := must(injector.New(s.bus, injector.Config{WorkerConfig: workerconfig.WorkerConfig{Instance: "injector-m", Logger: s.log, Grace: time.Second}, Rules: s.rules,
		Metrics: m, Observer: m.Observer("injector")}))
	s.start("injector-m", in.Run)
	eventstest.Eventually(t, 60*time.Second, func() error {
		if code, body := get(t, srv.URL+"/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz: %d %q", code, body)
		}
		return nil
	})
	eventstest.Eventually(t, 60*time.Second, func() error {
		for _, tool := range []string{"noop", "fail"} {
			if _, ok := cat.Lookup(tool); !ok {
				return fmt.Errorf("tool %s not in the catalog yet", tool)
			}
		}
		return nil
	})

	s.submit("metrics-1", toolbus.Limits{})
	if ended := s.waitEnd("metrics-1"); ended.Status != toolbus.RunCompleted {
		t.Fatalf("run ended %s/%s (%s), want completed", ended.Status, ended.Code, ended.Reason)
	}

	// The injector counts the outcome after publishing it: poll for the last series.
	var fams map[string]*dto.MetricFamily
	eventstest.Eventually(t, 60*time.Second, func() error {
		fams = scrape(t, srv.URL+"/metrics")
		if v, ok := value(fams, telemetry.MetricRunsEnded, map[string]string{"outcome": "completed", "code": ""}); !ok || v != 1 {
			return fmt.Errorf("runs ended completed = %v (present %v), want 1", v, ok)
		}
		return nil
	})
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{telemetry.MetricToolCalls, map[string]string{"tool": "noop", "status": "succeeded", "code": ""}, 2},
		{telemetry.MetricToolCalls, map[string]string{"tool": "fail", "status": "failed", "code": toolbus.CodeToolError}, 1},
		{telemetry.MetricToolCallDuration, map[string]string{"tool": "noop"}, 2}, // histogram: sample count
		{telemetry.MetricToolCallDuration, map[string]string{"tool": "fail"}, 1},
		{telemetry.MetricToolInFlight, map[string]string{"tool": "noop"}, 0},
		{telemetry.MetricModelDuration, map[string]string{"model": "test"}, 2},
		{telemetry.MetricModelTokens, map[string]string{"model": "test", "type": "input"}, 20},
		{telemetry.MetricModelTokens, map[string]string{"model": "test", "type": "output"}, 6},
		{telemetry.MetricQueuePending, map[string]string{"tool": "noop"}, 0},
		{telemetry.MetricReady, map[string]string{"role": "injector"}, 1},
	}
	for _, c := range checks {
		got, ok := value(fams, c.name, c.labels)
		if !ok {
			t.Errorf("%s%v: no such series", c.name, c.labels)
			continue
		}
		if got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Three results joined into one step, in one or more batches.
	if got, ok := value(fams, telemetry.MetricStepJoin, nil); !ok || got < 1 || got > 3 {
		t.Errorf("%s count = %v (present %v), want 1 to 3 joins", telemetry.MetricStepJoin, got, ok)
	}
	if got, ok := value(fams, telemetry.MetricModelErrors, map[string]string{"model": "test"}); ok && got != 0 {
		t.Errorf("model errors = %v, want none", got)
	}

	// Stopping a role makes the process not ready again.
	s.stop("injector-m")
	if code, _ := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz after the injector stopped: %d, want 503", code)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value returns the value of the series of name with exactly labels (a histogram's
// sample count); ok is false when there is no such series.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		match := true
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}
