package telemetry

import (
	"testing"

	"github.com/toolbus/toolbus/events/consume"
)

// families returns the metric families m exports (by name).
func families(t *testing.T, m *Metrics) map[string]bool {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		out[mf.GetName()] = true
	}
	return out
}

// Each process exports the collectors of the roles it runs: an executor exports no
// injector histogram (it would stay at 0), the injector's process does, and every
// process exports readiness.
func TestMetricsPerRole(t *testing.T) {
	for _, c := range []struct {
		roles       []string
		has, hasNot []string
	}{
		{roles: []string{RoleExecutor}, has: []string{MetricReady, MetricPermissionDenied}, hasNot: []string{MetricStepJoin}},
		{roles: []string{RolePlanner}, has: []string{MetricReady}, hasNot: []string{MetricStepJoin}},
		{roles: []string{RoleInjector}, has: []string{MetricStepJoin, MetricReady}},
		{roles: []string{RoleExecutor, RolePlanner, RoleInjector}, has: []string{MetricStepJoin}},
		{roles: nil, has: []string{MetricStepJoin}},
	} {
		m := New(c.roles...)
		for _, r := range c.roles {
			m.Observer(r) // registers the role: toolbus_ready shows it
		}
		m.Observer(RoleExecutor)
		// Observed or not, the collectors of the roles not run are not exported.
		m.StepJoined(0)
		m.CallFinished("t", "succeeded", "", 0, true)
		got := families(t, m)
		for _, name := range c.has {
			if !got[name] {
				t.Errorf("roles %v: %s not exported (%v)", c.roles, name, got)
			}
		}
		for _, name := range c.hasNot {
			if got[name] {
				t.Errorf("roles %v: %s exported", c.roles, name)
			}
		}
		if want := len(c.roles) == 0 || c.roles[0] == RoleExecutor; got[MetricToolCalls] != want {
			t.Errorf("roles %v: %s exported %v, want %v", c.roles, MetricToolCalls, got[MetricToolCalls], want)
		}
	}
}

// An executor's observer counts its parked queues: parks raise the gauge, wakes lower it.
func TestParkedQueuesGauge(t *testing.T) {
	m := New(RoleExecutor)
	po, ok := m.Observer(RoleExecutor).(consume.ParkObserver)
	if !ok {
		t.Fatal("the executor's observer is not told of parked queues")
	}
	po.Parked("tool_a", true)
	po.Parked("tool_b", true)
	po.Parked("tool_a", false)
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == MetricQueuesParked {
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 1 {
				t.Fatalf("%s = %v, want 1", MetricQueuesParked, v)
			}
			return
		}
	}
	t.Fatalf("%s not exported", MetricQueuesParked)
}
