package node

import (
	"log/slog"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/consume"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/telemetry"
)

// startTelemetry serves metrics, /healthz and /readyz at cfg.MetricsAddr for the roles of
// this process (only those roles' collectors: telemetry.New); with no address it returns nil metrics (nothing is recorded) and a no-op
// stop.
func startTelemetry(cfg Config, bus *events.Bus, log *slog.Logger, roles []string) (*telemetry.Metrics, func(), error) {
	if cfg.MetricsAddr == "" {
		return nil, func() {}, nil
	}
	m := telemetry.New(roles...)
	m.WatchQueues(bus, 0, log)
	m.WatchPermissions(bus, log)
	srv, err := telemetry.Listen(cfg.MetricsAddr, m.Handler(bus.Conn().IsConnected), log)
	if err != nil {
		return nil, nil, err
	}
	return m, func() { _ = srv.Close() }, nil
}

// The worker packages take interfaces; a nil *telemetry.Metrics must become a nil
// interface, not an interface holding a nil pointer.

func executorMetrics(m *telemetry.Metrics) worker.Metrics {
	if m == nil {
		return nil
	}
	return m
}

func plannerMetrics(m *telemetry.Metrics) planner.Metrics {
	if m == nil {
		return nil
	}
	return m
}

func injectorMetrics(m *telemetry.Metrics) injector.Metrics {
	if m == nil {
		return nil
	}
	return m
}

func serveObserver(m *telemetry.Metrics, role string) consume.Observer {
	if m == nil {
		return nil
	}
	return m.Observer(role)
}
