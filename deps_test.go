package toolbus_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The dependency rule of the architecture: events imports no worker; executor, planner
// and injector import events and never each other; only cmd/ wires them.
func TestDependencyDirection(t *testing.T) {
	const mod = "github.com/toolbus/toolbus/"
	forbidden := map[string][]string{
		"events":   {"executor", "planner", "injector", "cmd"},
		"executor": {"planner", "injector", "cmd"},
		"planner":  {"executor", "injector", "cmd"},
		"injector": {"executor", "planner", "cmd"},
	}
	// The domain types and the executor core link no bus: an executor runs in-process
	// without NATS or CloudEvents (the bus side is executor/worker).
	for _, pkg := range []string{".", "executor"} {
		out, err := exec.Command("go", "list", "-deps", "./"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/nats-io/") || strings.HasPrefix(dep, "github.com/cloudevents/") ||
				(strings.HasPrefix(dep, mod) && pkg == ".") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-deps", "./"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range bad {
				if dep == mod+b || strings.HasPrefix(dep, mod+b+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
