package main

import (
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
	"github.com/toolbus/toolbus/internal/testutil"
)

// `toolbus executor` with TOOLBUS_METRICS_ADDR serves /healthz, /readyz (ready once its
// tool queues are bound) and /metrics, and stops serving when the role stops. Each role
// exports its own metrics: the injector's step-join histogram shows where the injector
// runs, not on an executor (where it would stay at 0).
func TestRoleServesMetrics(t *testing.T) {
	srv := eventstest.RunJetStream(t)
	ctx := eventstest.Context(t, 2*time.Minute)
	if _, _, err := provision.Setup(ctx, srv.Conn, events.Config{}, provision.WithWorkers(provision.RoleInjector, provision.WorkerSettings{})); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOOLBUS_NATS_URL", srv.URL)
	t.Setenv("TOOLBUS_LOG_LEVEL", "warn")
	t.Setenv("TOOLBUS_GRACE", "1s")
	for _, c := range []struct {
		role        string
		want, wantN []string
	}{
		{role: "executor", want: []string{`toolbus_ready{role="executor"} 1`, `toolbus_tool_queue_pending{tool="calculator"} 0`},
			wantN: []string{"toolbus_step_join_duration_seconds", `role="injector"`}},
		{role: "injector", want: []string{`toolbus_ready{role="injector"} 1`, "toolbus_step_join_duration_seconds_count 0"},
			wantN: []string{`role="executor"`}},
	} {
		t.Run(c.role, func(t *testing.T) {
			body := roleMetrics(t, ctx, c.role)
			for _, want := range c.want {
				if !strings.Contains(body, want) {
					t.Errorf("/metrics of %s lacks %q:\n%s", c.role, want, body)
				}
			}
			for _, not := range c.wantN {
				if strings.Contains(body, not) {
					t.Errorf("/metrics of %s has %q:\n%s", c.role, not, body)
				}
			}
		})
	}
}

// roleMetrics runs `toolbus <role>` with TOOLBUS_METRICS_ADDR until /readyz answers 200,
// reads /metrics, stops the role and checks that the metrics server stopped with it.
func roleMetrics(t *testing.T, ctx context.Context, role string) string {
	addr := freeAddr(t)
	t.Setenv("TOOLBUS_METRICS_ADDR", addr)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, 1)
	var stderr testutil.Buffer
	go func() { done <- run(rctx, []string{role}, io.Discard, &stderr) }()

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
	cancel()
	select {
	case c := <-done:
		if c != 0 {
			t.Fatalf("%s exited %d: %s", role, c, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not stop", role)
	}
	if _, _, err := httpGet("http://" + addr + "/healthz"); err == nil {
		t.Fatal("the metrics server still answers after the role stopped")
	}
	return body
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
