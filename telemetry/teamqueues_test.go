package telemetry_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/intake/intaketest"
	"github.com/toolbus/toolbus/telemetry"
)

// An executor in a team account exports no queue gauges: they are read from the
// queues' consumer infos, which the core exports to no team (issue 54: a team's flood of
// them timed out every tenant's infos). The core's executor exports them (the control).
func TestTeamAccountQueueGauges(t *testing.T) {
	srv := intaketest.StartAccounts(t, "alpha", []string{"calc"})
	connect := func(user string) *nats.Conn { return eventstest.Connect(t, srv, user) }
	ctx := eventstest.Context(t, time.Minute)
	core, _, err := provision.Setup(ctx, connect("core"), events.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provision.Consumer(ctx, core, provision.ToolConsumerConfig("calc", 0, 0)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		req := toolbus.ToolRequested{RunID: fmt.Sprintf("q-%d", i), Call: toolbus.ToolCall{CallID: "c1", Tool: "calc", Arguments: `{}`}}
		if _, err := core.PublishEvent(ctx, events.ToolRequestedEvent("/test", req, true)); err != nil {
			t.Fatal(err)
		}
	}
	team, err := events.Open(ctx, connect("alpha"), events.Config{APIPrefix: eventstest.TeamAPIPrefix})
	if err != nil {
		t.Fatal(err)
	}
	m := telemetry.New(telemetry.RoleExecutor)
	m.WatchQueues(team, 5*time.Second, nil)
	web := httptest.NewServer(m.Handler(func() bool { return true }))
	t.Cleanup(web.Close)
	scrape := func() string {
		t.Helper()
		resp, err := http.Get(web.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if body := scrape(); strings.Contains(body, telemetry.MetricQueuePending+"{") {
		t.Fatalf("a team account read queue gauges from a catalog it may not read:\n%s", body)
	}
	m.QueuesOf(func() []string { return []string{"calc"} })
	if body := scrape(); strings.Contains(body, telemetry.MetricQueuePending+"{") {
		t.Errorf("a team account's executor exports queue gauges:\n%s", body)
	}
	cm := telemetry.New(telemetry.RoleExecutor)
	cm.WatchQueues(core, 5*time.Second, nil)
	cm.QueuesOf(func() []string { return []string{"calc"} })
	cweb := httptest.NewServer(cm.Handler(func() bool { return true }))
	t.Cleanup(cweb.Close)
	// The server copies the calls into the queue stream on its own time: poll.
	eventstest.Eventually(t, 20*time.Second, func() error {
		resp, err := http.Get(cweb.URL + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if want := telemetry.MetricQueuePending + `{tool="calc"} 3`; !strings.Contains(string(b), want) {
			return fmt.Errorf("control: no %s in the core executor's metrics", want)
		}
		return nil
	})
}
