package toolbus_test

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/toolbus/toolbus"

// deps lists the packages pkg links (go list -deps), its own included.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "./"+pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pkg, err, out)
	}
	return strings.Fields(string(out))
}

// The dependency rule of the architecture: events (and its store) imports no worker;
// executor, planner and injector import events and never each other; audit reads
// events and imports no worker; only cmd/ wires them. Beyond the module's own packages, some packages must not link whole families
// of outside modules.
func TestDependencyDirection(t *testing.T) {
	workers := []string{"executor", "planner", "injector", "cmd"}
	tests := []struct {
		pkg string
		// module packages (and their subpackages) pkg must not link
		notModule []string
		// import path prefixes of outside modules pkg must not link
		notOutside []string
		why        string
	}{
		{pkg: ".", notModule: []string{""}, notOutside: []string{"github.com/nats-io/", "github.com/cloudevents/"},
			why: "the domain types import nothing and link no bus"},
		{pkg: "executor", notModule: []string{"planner", "injector", "cmd"}, notOutside: []string{"github.com/nats-io/", "github.com/cloudevents/"},
			why: "the executor core runs in-process without NATS or CloudEvents (the bus side is executor/worker)"},
		{pkg: "events", notModule: workers, why: "the wire imports no worker"},
		{pkg: "events/store", notModule: append([]string{"events"}, workers...), notOutside: []string{"github.com/cloudevents/"},
			why: "the store is state, not wire"},
		{pkg: "planner", notModule: []string{"executor", "injector", "cmd"}, notOutside: []string{"github.com/openai/", "github.com/anthropics/"},
			why: "implementing planner.Model links no provider SDK (the adapters live in planner/openai and planner/anthropic)"},
		{pkg: "planner/modeltest", notOutside: []string{"github.com/openai/", "github.com/anthropics/"},
			why: "the Model conformance suite links no provider SDK"},
		{pkg: "audit", notModule: workers, why: "the audit reads events and imports no worker"},
		{pkg: "console", notModule: []string{"executor", "planner", "injector", "cmd"}, why: "the console reads the bus and imports no worker"},
		{pkg: "injector", notModule: []string{"executor", "planner", "cmd"}, why: "workers meet only on the bus"},
		{pkg: "internal/golden", notModule: []string{"events", "executor", "planner", "injector", "cmd", "embedded", "connect"},
			why: "test helpers import nothing of the module: any package's tests may use them"},
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			self := mod
			if tt.pkg != "." {
				self = mod + "/" + tt.pkg
			}
			for _, dep := range deps(t, tt.pkg) {
				for _, bad := range tt.notModule {
					p := mod
					if bad != "" {
						p = mod + "/" + bad
					}
					if dep != self && (dep == p || strings.HasPrefix(dep, p+"/")) {
						t.Errorf("%s depends on %s: %s", tt.pkg, dep, tt.why)
					}
				}
				for _, bad := range tt.notOutside {
					if strings.HasPrefix(dep, bad) {
						t.Errorf("%s depends on %s: %s", tt.pkg, dep, tt.why)
					}
				}
			}
		})
	}
}

// The demo binary (make demo: -tags toolbus_lite) links no model provider SDK and no OTLP
// exporter (nor gRPC, which only the exporter brings): they are most of a cold build.
// go vet type-checks the files the tag selects.
func TestLiteBuildLinksNoSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the lite build")
	}
	out, err := exec.Command("go", "list", "-deps", "-tags", "toolbus_lite", "./cmd/toolbus").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"github.com/openai/", "github.com/anthropics/", "google.golang.org/grpc", "go.opentelemetry.io/otel/exporters/"} {
			if strings.HasPrefix(dep, bad) {
				t.Errorf("the toolbus_lite build links %s", dep)
			}
		}
	}
	if out, err := exec.Command("go", "vet", "-tags", "toolbus_lite", "./cmd/toolbus", "./telemetry").CombinedOutput(); err != nil {
		t.Fatalf("go vet -tags toolbus_lite: %v\n%s", err, out)
	}
}
