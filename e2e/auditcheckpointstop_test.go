package e2e_test

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/telemetry"
)

// restartCheckpoints starts the core's checkpoint service as a core (re)started now
// would, with its metrics, and returns what /metrics and /readyz show once it has
// either signed a checkpoint or stopped signing; the service is stopped again.
func restartCheckpoints(t *testing.T, s *signedStack, name string) (metrics, readyz string) {
	t.Helper()
	m := telemetry.New(telemetry.RoleInjector)
	s.start(name, (&checkpoint.Service{Bus: s.buses["planner"], Interval: time.Minute, Log: s.log, Metrics: m}).Run)
	defer s.stop(name)
	h := m.Handler(nil)
	get := func(path string) string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Body.String()
	}
	eventstest.Eventually(t, time.Minute, func() error {
		metrics = get("/metrics")
		if gauge(metrics, telemetry.MetricCheckpointsStop) == "1" || gauge(metrics, telemetry.MetricCheckpointSize) != "0" {
			return nil
		}
		return errors.New("the restarted checkpoint service neither signed nor stopped yet")
	})
	return metrics, get("/readyz")
}

// mustStopCheckpoints wants a checkpoint service started on the rewritten stream to
// show that it stopped signing: the metric at 1, /readyz naming the checkpoints.
func mustStopCheckpoints(t *testing.T, s *signedStack) {
	t.Helper()
	metrics, readyz := restartCheckpoints(t, s, "checkpoint-rewritten")
	if gauge(metrics, telemetry.MetricCheckpointsStop) != "1" || !strings.Contains(readyz, "checkpoints stopped") {
		t.Fatalf("a checkpoint service on the rewritten stream does not show it stopped: %s %s, /readyz: %s",
			telemetry.MetricCheckpointsStop, gauge(metrics, telemetry.MetricCheckpointsStop), readyz)
	}
	t.Log(strings.TrimSpace(readyz))
}

// mustSignCheckpoints is the CONTROL: on the untouched stream a restarted service signs
// (the size gauge moves), and neither the metric nor /readyz shows a stop.
func mustSignCheckpoints(t *testing.T, s *signedStack) {
	t.Helper()
	metrics, readyz := restartCheckpoints(t, s, "checkpoint-untouched")
	if gauge(metrics, telemetry.MetricCheckpointsStop) != "0" || gauge(metrics, telemetry.MetricCheckpointSize) == "0" || strings.Contains(readyz, "checkpoints") {
		t.Fatalf("a checkpoint service on the untouched stream does not sign: %s %s, %s %s, /readyz: %s",
			telemetry.MetricCheckpointsStop, gauge(metrics, telemetry.MetricCheckpointsStop),
			telemetry.MetricCheckpointSize, gauge(metrics, telemetry.MetricCheckpointSize), readyz)
	}
}

// gauge is the value of an unlabelled metric in a /metrics text ("" when absent).
func gauge(metrics, name string) string {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return ""
}
