package node

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/intake"
)

// envVars lists the envconfig variables of t, embedded structs included.
func envVars(t reflect.Type) map[string]bool {
	vars := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			for v := range envVars(f.Type) {
				vars[v] = true
			}
			continue
		}
		if tag := f.Tag.Get("envconfig"); tag != "" && f.Tag.Get("ignored") != "true" {
			vars[tag] = true
		}
	}
	return vars
}

// TestExecutorSettingsShared: every executor variable of the binary (TOOLBUS_EXECUTOR_*,
// the team, timeouts, output bound, connection, worker settings) is one that Serve reads
// too (worker.EnvConfig), so an executor of your own cannot miss one.
func TestExecutorSettingsShared(t *testing.T) {
	serve := envVars(reflect.TypeOf(worker.EnvConfig{}))
	bin := envVars(reflect.TypeOf(Config{}))
	executorVars := envVars(reflect.TypeOf(worker.Settings{}))
	for v := range bin {
		if strings.HasPrefix(v, "EXECUTOR_") {
			executorVars[v] = true
		}
	}
	for _, v := range []string{"NATS_URL", "NATS_CREDS", "NATS_PASSWORD", "TEAM", "INSTANCE", "CONCURRENCY", "METRICS_ADDR", "LOG_LEVEL"} {
		executorVars[v] = true
	}
	for v := range executorVars {
		if !bin[v] {
			t.Errorf("TOOLBUS_%s: not a variable of the binary", v)
		}
		if !serve[v] {
			t.Errorf("TOOLBUS_%s: the binary's executor reads it, worker.Serve does not", v)
		}
	}
}

// TestTenantBytesDefault: the injector bounds each tenant's writes by default, at
// intake.DefaultBytesPerSecond (what toolbus admin init tells the administrator).
func TestTenantBytesDefault(t *testing.T) {
	f, ok := reflect.TypeOf(Config{}).FieldByName("TenantBytesPerSecond")
	if !ok || f.Tag.Get("default") != strconv.Itoa(intake.DefaultBytesPerSecond) {
		t.Errorf("TOOLBUS_TENANT_BYTES_PER_SECOND defaults to %q, want %d (intake.DefaultBytesPerSecond)", f.Tag.Get("default"), intake.DefaultBytesPerSecond)
	}
}
