package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
)

// `toolbus executor` with TOOLBUS_METRICS_ADDR serves /healthz, /readyz (ready once its
// tool queues are bound) and /metrics, and stops serving when the role stops.
func TestRoleServesMetrics(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	if _, _, err := provision.Setup(ctx, srv.Conn, events.Config{}); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	t.Setenv("TOOLBUS_NATS_URL", srv.URL)
	t.Setenv("TOOLBUS_METRICS_ADDR", addr)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	t.Setenv("TOOLBUS_GRACE", "1s")

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() { done <- run(rctx, []string{"executor"}, io.Discard, &stderr) }()

	eventstest.Eventually(t, 60*time.Second, func() error {
		code, body, err := httpGet("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/readyz: %d %q", code, body)
		}
		return nil
	})
	code, body, err := httpGet("http://" + addr + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	for _, want := range []string{`toolbus_ready{role="executor"} 1`, `toolbus_tool_queue_pending{tool="calculator"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	cancel()
	select {
	case c := <-done:
		if c != 0 {
			t.Fatalf("executor exited %d: %s", c, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("executor did not stop")
	}
	if _, _, err := httpGet("http://" + addr + "/healthz"); err == nil {
		t.Fatal("the metrics server still answers after the role stopped")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func httpGet(url string) (int, string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
