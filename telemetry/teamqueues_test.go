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
	"github.com/toolbus/toolbus/telemetry"
)

// An executor in a team account may not read the catalog whole: its queue gauges are
// those of its own tools (QueuesOf), read through the consumer infos the core exports
// to the team. Without QueuesOf the scrape has no queue series at all.
func TestTeamAccountQueueGauges(t *testing.T) {
	srv := eventstest.StartAccounts(t, "alpha", []string{"calc"})
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
	// The server copies the calls into the queue stream on its own time: poll.
	eventstest.Eventually(t, 20*time.Second, func() error {
		if body, want := scrape(), telemetry.MetricQueuePending+`{tool="calc"} 3`; !strings.Contains(body, want) {
			return fmt.Errorf("no %s in the team executor's metrics:\n%s", want, body)
		}
		return nil
	})
}
