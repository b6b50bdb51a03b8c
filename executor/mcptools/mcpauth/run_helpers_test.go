package mcpauth_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/internal/testutil"
	"github.com/toolbus/toolbus/planner"
)

// completeRun starts a planner on model and an injector in roles, starts run (one user
// message) and waits until it completed; it returns the run's events.
func completeRun(t *testing.T, ctx context.Context, roles *testutil.Group, bus *events.Bus, cat *store.Catalog,
	model planner.Model, wc func(string) workerconfig.WorkerConfig, run string) []runlog.StoredEvent {
	t.Helper()
	roles.Go("planner-1", testutil.Must(planner.New(bus, model, cat, planner.Config{WorkerConfig: wc("planner-1")})).Run)
	roles.Go("injector-1", testutil.Must(injector.New(bus, injector.Config{WorkerConfig: wc("injector-1")})).Run)

	if err := bus.StartRun(ctx, "/test", toolbus.RunStarted{RunID: run, Model: "script",
		Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "leak"}}}); err != nil {
		t.Fatal(err)
	}
	var evs []runlog.StoredEvent
	eventstest.Eventually(t, time.Minute, func() error {
		st, _, err := bus.Store().RunState(ctx, run)
		if err != nil {
			return err
		}
		if st.Status != toolbus.RunCompleted {
			return fmt.Errorf("run is %s", st.Status)
		}
		evs, err = runlog.Events(ctx, bus, run)
		return err
	})
	return evs
}
