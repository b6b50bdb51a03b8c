package e2e_test

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/telemetry"
)

// restartCheckpoints starts the core's checkpoint service as a core (re)started now
// would, with its metrics, and returns its checkpoint gauges (size, refused) and what it
// logged at error once it has either signed a checkpoint or stopped signing; the
// service is stopped again.
func restartCheckpoints(t *testing.T, s *signedStack, name string) (size, refused, logged string) {
	t.Helper()
	m := telemetry.New(telemetry.RoleInjector)
	var out lockedBuffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelError}))
	s.start(name, (&checkpoint.Service{Bus: s.buses["planner"], Interval: time.Minute, Log: log, Metrics: m}).Run)
	defer s.stop(name)
	h := m.Handler(nil)
	eventstest.Eventually(t, time.Minute, func() error {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		metrics := rec.Body.String()
		size, refused = gauge(metrics, telemetry.MetricCheckpointSize), gauge(metrics, telemetry.MetricCheckpointsStop)
		if refused == "1" || size != "0" {
			return nil
		}
		return errors.New("the restarted checkpoint service neither signed nor stopped yet")
	})
	return size, refused, out.String()
}

// mustStopCheckpoints wants a checkpoint service started on the rewritten stream to
// show that it stopped signing: the metric at 1 and an error logged saying why.
func mustStopCheckpoints(t *testing.T, s *signedStack) {
	t.Helper()
	size, refused, logged := restartCheckpoints(t, s, "checkpoint-rewritten")
	if refused != "1" || size != "0" || !strings.Contains(logged, "signing STOPPED") {
		t.Fatalf("a checkpoint service on the rewritten stream does not show it stopped: %s %s, %s %s, logged %q",
			telemetry.MetricCheckpointsStop, refused, telemetry.MetricCheckpointSize, size, logged)
	}
	t.Log(strings.TrimSpace(logged))
}

// mustSignCheckpoints is the CONTROL: on the untouched stream a restarted service signs
// (the size gauge moves) and shows no stop.
func mustSignCheckpoints(t *testing.T, s *signedStack) {
	t.Helper()
	size, refused, logged := restartCheckpoints(t, s, "checkpoint-untouched")
	if refused != "0" || size == "0" || logged != "" {
		t.Fatalf("a checkpoint service on the untouched stream does not sign: %s %s, %s %s, logged %q",
			telemetry.MetricCheckpointsStop, refused, telemetry.MetricCheckpointSize, size, logged)
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

// lockedBuffer is a log's output, written by the service's goroutine, read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
