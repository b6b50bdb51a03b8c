package toolbus_test

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/toolbus/toolbus"

// modulePackages returns every package of the module (go list ./..., relative to the
// module: "." for the root) with the packages it links (go list -deps).
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkgs[rel(f[0])] = f[1:]
	}
	return pkgs
}

// rel is an import path of the module relative to it ("." for the root).
func rel(path string) string {
	if path == mod {
		return "."
	}
	return strings.TrimPrefix(path, mod+"/")
}

// under reports whether the package pkg (relative) is prefix or below it.
func under(pkg, prefix string) bool {
	return pkg == prefix || strings.HasPrefix(pkg, prefix+"/")
}

// depRule is a rule of the package map: the packages under prefix (all of them, or
// only prefix itself when exact) must not link the module packages under any of
// notModule, nor outside packages whose path starts with one of notOutside.
type depRule struct {
	prefix     string
	exact      bool
	notModule  []string
	notOutside []string
	why        string
}

// workers are the packages that do a role's work or wire the roles together.
var workers = []string{"executor", "planner", "injector", "cmd", "e2e", "faults", "examples"}

var (
	sdks      = []string{"github.com/openai/", "github.com/anthropics/"}
	busLibs   = []string{"github.com/nats-io/", "github.com/cloudevents/"}
	allButSDK = append([]string{"events", "audit", "telemetry", "conformance", "connect", "embedded", "deploy", "internal"}, workers...)
)

// depRules: every rule whose prefix covers a package applies to it. Every package of the
// module must be covered by at least one rule (beyond the root's), so a new package
// needs a line here saying where it stands.
var depRules = []depRule{
	{prefix: ".", exact: true, notModule: allButSDK, notOutside: busLibs, why: "the domain types import nothing and link no bus"},
	{prefix: "audit", notModule: workers, why: "the audit reads events and imports no worker"},
	{prefix: "internal", notModule: append([]string{"audit", "callrun", "console", "decide", "fair", "intake", "mcpserver", "reads", "sdk", "timeline", "tools"}, allButSDK...),
		why: "internal/ is the bottom floor: helpers any package may import, importing nothing of the module"},
	{prefix: "cmd", notModule: []string{"e2e", "faults", "examples"}, why: "the command wires the roles"},
	{prefix: "cmd/toolbus/internal/bench", notModule: []string{"cmd/toolbus/internal/node", "cmd/toolbus/internal/admin"}, why: "the benchmark wires the roles in-process; the command calls it"},
	{prefix: "console", notModule: workers, why: "the console reads the bus and imports no worker"},
	{prefix: "intake", notModule: workers, why: "the write service admits tenants' writes into the core and imports no worker"},
	{prefix: "reads", notModule: workers, why: "the read service reads the bus for client accounts and imports no worker"},
	{prefix: "conformance", notModule: workers, why: "the conformance suite drives an executor process over the bus only"},
	{prefix: "connect", notModule: append([]string{"events"}, workers...), why: "connection options and permission tracking know nothing of the wire"},
	{prefix: "deploy", notModule: workers, why: "deployment files and their generators link no worker"},
	{prefix: "e2e", notModule: []string{"faults", "examples"}, why: "the end-to-end tests wire the roles in-process"},
	{prefix: "embedded", notModule: append([]string{"events"}, workers...), why: "the embedded server knows nothing of the wire"},
	{prefix: "events", notModule: append([]string{"audit", "telemetry", "conformance", "deploy"}, workers...), why: "the wire imports no worker"},
	{prefix: "events/eventstest", notModule: []string{"intake", "reads"}, why: "the wire's test servers sit below the services; the write service's harness is intake/intaketest"},
	{prefix: "events/follow", notModule: []string{"events/provision", "events/consume"}, why: "following runs and their outcomes reads the wire; it creates and serves no consumer"},
	{prefix: "events/consume", notModule: []string{"events/provision"}, why: "the consume loop serves consumers and creates none (events is below it)"},
	{prefix: "events/provision", notModule: []string{"events/consume"}, why: "provisioning creates what the consume loop serves and serves nothing"},
	{prefix: "events/runlog", notModule: []string{"events/provision", "events/consume", "events/follow"}, why: "reading what a run stored reads the wire with direct gets; it creates and serves no consumer"},
	{prefix: "events/teamqueue", notModule: []string{"events/provision", "events/consume", "events/follow"}, why: "a team's pulls of its queue are wire requests; the consume loop serves them, so it imports none of it"},
	{prefix: "events/workerconfig", notModule: []string{"events/provision", "events/consume", "events/follow", "events/accounts"}, why: "the workers' configuration is values and their checks, below every worker and what they share"},
	{prefix: "events/store", notModule: []string{"events"}, notOutside: []string{"github.com/cloudevents/"}, why: "the store is state, not wire"},
	{prefix: "examples", notModule: []string{"planner", "injector", "cmd", "e2e", "faults"}, why: "an executor example uses the executor side only"},
	{prefix: "executor", notModule: []string{"planner", "injector", "cmd", "e2e", "faults", "examples"}, why: "workers meet only on the bus"},
	{prefix: "executor", exact: true, notModule: []string{"events", "executor/worker"}, notOutside: busLibs,
		why: "the executor core runs in-process without NATS or CloudEvents (the bus side is executor/worker)"},
	{prefix: "fair", notModule: []string{"executor", "planner", "injector", "cmd", "timeline", "e2e", "faults", "examples"}, why: "the fair scheduler is a core worker: it meets the others only on the bus"},
	{prefix: "faults", notModule: []string{"cmd", "e2e", "examples"}, why: "the fault tests run the binaries; faultbus wires its own roles"},
	{prefix: "injector", notModule: []string{"executor", "planner", "cmd", "e2e", "faults", "examples"}, why: "workers meet only on the bus"},
	{prefix: "cmd/toolbus/internal/admin", notModule: []string{"executor", "planner", "injector", "cmd/toolbus/internal/node", "cmd/toolbus/internal/bench", "e2e", "faults", "examples"}, why: "a deployment's administration issues credentials and pushes accounts; it links no worker"},
	{prefix: "callrun", notModule: workers, why: "the run of one pre-planned call is built alike by the command and the MCP server"},
	{prefix: "cmd/toolbus/internal/node", notModule: []string{"cmd/toolbus/internal/admin", "e2e", "faults", "examples"}, why: "a toolbus process (configuration, bus, roles) is wired here for the command, never from it"},
	{prefix: "decide", notModule: append([]string{"callrun", "timeline"}, workers...), why: "the human decisions on a run read events: the executor's worker imports them, so they import no worker"},
	{prefix: "timeline", notModule: workers, why: "the terminal views of runs read events and import no worker"},
	{prefix: "mcpserver", notModule: workers, why: "the MCP server reads and starts runs over the bus and imports no worker"},
	{prefix: "planner", notModule: []string{"executor", "injector", "cmd", "e2e", "faults", "examples"}, why: "workers meet only on the bus"},
	{prefix: "planner", exact: true, notOutside: sdks,
		why: "implementing planner.Model links no provider SDK (the adapters live in planner/openai and planner/anthropic)"},
	{prefix: "planner/modeltest", notOutside: sdks, why: "the Model conformance suite links no provider SDK"},
	{prefix: "telemetry", notModule: workers, why: "metrics and tracing link no worker"},
	{prefix: "tools/mcp-conformance/client", notModule: []string{"planner", "injector", "cmd", "e2e", "faults", "examples"},
		why: "the client scenarios' wrapper drives the executor side (its MCP client) only"},
	{prefix: "sdk", notModule: []string{"audit", "conformance", "deploy", "cmd", "e2e", "faults", "examples"},
		why: "the other languages' packages meet toolbus on the bus only; their test server runs the real roles (planner, injector, a Go executor) on an embedded server"},
	{prefix: "tools/mcp-conformance", notModule: []string{"cmd", "e2e", "faults", "examples"},
		why: "the MCP conformance suite's Go side wires the roles in-process for its test, as e2e does"},
	{prefix: "tools/mcp-conformance/fixtures", notModule: []string{"events", "planner", "injector", "mcpserver", "cmd", "internal"},
		why: "the suite's fixture tools are an executor's tools, written on the executor SDK only"},
}

// checkDeps applies depRules to pkg (relative to the module) linking deps (import
// paths): what each rule it breaks says, and whether a rule beyond the root's covers it.
func checkDeps(pkg string, deps []string) (broken []string, covered bool) {
	for _, r := range depRules {
		if r.exact && pkg != r.prefix || !r.exact && !under(pkg, r.prefix) {
			continue
		}
		covered = covered || !r.exact
		for _, dep := range deps {
			if !strings.HasPrefix(dep, mod) {
				for _, bad := range r.notOutside {
					if strings.HasPrefix(dep, bad) {
						broken = append(broken, pkg+" links "+dep+": "+r.why)
					}
				}
				continue
			}
			d := rel(dep)
			for _, bad := range r.notModule {
				// A package may link its own subpackages (and the root's rule is exact).
				if !under(d, pkg) && under(d, bad) {
					broken = append(broken, pkg+" links "+d+": "+r.why)
				}
			}
		}
	}
	return broken, covered
}

// The package map of the architecture, for every package of the module by prefix:
// events imports no worker; executor, planner and injector import events and never
// each other; only cmd (and the tests and binaries that stand in for it) wires them.
func TestDependencyDirection(t *testing.T) {
	pkgs := modulePackages(t)
	if len(pkgs) < 30 {
		t.Fatalf("go list ./... lists %d packages", len(pkgs))
	}
	for pkg, deps := range pkgs {
		broken, covered := checkDeps(pkg, deps)
		for _, b := range broken {
			t.Error(b)
		}
		if !covered && pkg != "." {
			t.Errorf("package %s is covered by no rule of depRules: add one saying what it may link", pkg)
		}
	}
}

// The rules catch what they are for: events linking a worker, the executor linking
// the planner, the executor core linking NATS, a package no rule covers.
func TestDependencyRulesBite(t *testing.T) {
	for _, c := range []struct{ pkg, dep string }{
		{"events", mod + "/executor/worker"},
		{"events/store", mod + "/events"},
		{"events/consume", mod + "/events/provision"},
		{"events/provision", mod + "/events/consume"},
		{"events/eventstest", mod + "/intake"},
		{"executor/worker", mod + "/planner"},
		{"executor", "github.com/nats-io/nats.go"},
		{"executor", mod + "/events"},
		{"injector", mod + "/executor"},
		{"planner", "github.com/openai/openai-go/v3"},
		{"internal/testutil", mod + "/events"},
		{"timeline", mod + "/cmd/toolbus/internal/node"},
		{"decide", mod + "/timeline"},
		{"internal/door", mod + "/decide"},
		{".", mod + "/events"},
	} {
		if broken, _ := checkDeps(c.pkg, []string{c.dep}); len(broken) == 0 {
			t.Errorf("%s linking %s breaks no rule", c.pkg, c.dep)
		}
	}
	if _, covered := checkDeps("newpkg", nil); covered {
		t.Error("a package under no prefix counts as covered")
	}
	if broken, covered := checkDeps("executor/worker", []string{mod + "/events", mod + "/executor", mod}); len(broken) != 0 || !covered {
		t.Errorf("executor/worker linking events and the executor: %v, covered %v", broken, covered)
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
	if out, err := exec.Command("go", "vet", "-tags", "toolbus_lite", "./cmd/toolbus", "./telemetry", "./planner/models").CombinedOutput(); err != nil {
		t.Fatalf("go vet -tags toolbus_lite: %v\n%s", err, out)
	}
}

// A tool team's executor on the SDK (executor, executor/worker: worker.Serve) links no
// OTLP exporter and so no gRPC unless it imports telemetry/otlp: they would be most of a
// small executor's binary. The full toolbus binary links them.
func TestExecutorSDKLinksNoOTLP(t *testing.T) {
	if testing.Short() {
		t.Skip("lists the packages' dependencies")
	}
	bad := []string{"google.golang.org/grpc", "go.opentelemetry.io/otel/exporters/"}
	links := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		var found []string
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range bad {
				if strings.HasPrefix(dep, b) {
					found = append(found, dep)
				}
			}
		}
		return found
	}
	for _, pkg := range []string{"./executor", "./executor/worker"} {
		if found := links(pkg); len(found) != 0 {
			t.Errorf("%s links %v", pkg, found)
		}
	}
	if len(links("./cmd/toolbus")) == 0 {
		t.Error("the full toolbus binary links no OTLP exporter: its traces would be refused")
	}
}
