package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /metrics (Prometheus text or OpenMetrics), /healthz (the process
// answers: 200; 503 once Failed said it cannot work any more) and /readyz (200 when connected reports true and every role registered
// with Observer serves; 503 with the reason otherwise). connected may be nil.
func (m *Metrics) Handler(connected func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		m.mu.Lock()
		failed := m.failed
		m.mu.Unlock()
		if failed != "" {
			http.Error(w, "failed: "+failed, http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if connected != nil && !connected() {
			http.Error(w, "not connected to NATS", http.StatusServiceUnavailable)
			return
		}
		if probs := m.problems(); len(probs) > 0 {
			http.Error(w, "not ready: "+strings.Join(probs, "; "), http.StatusServiceUnavailable)
			return
		}
		ok, notReady := m.Ready()
		if !ok {
			sort.Strings(notReady)
			http.Error(w, "consumers not bound: "+strings.Join(notReady, ", "), http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ready")
	})
	return mux
}

// Server is a running metrics and health endpoint.
type Server struct {
	srv *http.Server
	ln  net.Listener
	log *slog.Logger
}

// Listen starts serving h at addr (host:port; port 0 picks a free one).
func Listen(addr string, h http.Handler, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("telemetry: listen on %s: %w", addr, err)
	}
	s := &Server{srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, ln: ln, log: log}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "error", err)
		}
	}()
	log.Info("metrics serving", "addr", ln.Addr().String(), "paths", "/metrics /healthz /readyz")
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, letting in-flight scrapes finish for up to 5s.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	s.log.Info("metrics stopped")
	return err
}
