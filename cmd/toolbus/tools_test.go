package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/callrun"
)

// `toolbus tools` lists every tool of the catalog with its owner (team), its version
// and the instances serving it; a contract whose instances are gone is listed as not
// offered.
func TestToolsCommand(t *testing.T) {
	p := startOpsPipeline(t, nil)
	if err := p.bus.Store().PublishTool(p.ctx, toolbus.ToolContract{Name: "orphan", Description: "nobody serves me", Owner: "payments", Version: 3}, false); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := p.toolbus("tools", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rows []callrun.ToolRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	byName := map[string]callrun.ToolRow{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	if r := byName["calculator"]; !r.Offered || len(r.Instances) != 1 || r.Instances[0] != "exec-1" {
		t.Errorf("calculator row %+v", r)
	}
	if r := byName["orphan"]; r.Offered || len(r.Instances) != 0 || r.Owner != "payments" || r.Version != 3 {
		t.Errorf("orphan row %+v", r)
	}
	code, out, _ = p.toolbus("tools")
	if code != 0 {
		t.Fatalf("table: exit %d", code)
	}
	lines := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		lines[f[0]] = f
	}
	for tool, want := range map[string][]string{
		"TOOL":       {"TOOL", "OWNER", "VERSION", "INSTANCES", "PENDING", "IN", "FLIGHT", "DESCRIPTION"},
		"orphan":     {"orphan", "payments", "v3", "-", "(not", "offered)", "0", "0", "nobody"},
		"calculator": {"calculator", "-", "-", "exec-1"},
	} {
		if got := lines[tool]; len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
			t.Errorf("row %s = %q, want it to start with %q\n%s", tool, got, want, out)
		}
	}
	if code, _, _ := p.toolbus("tools", "extra"); code != 2 {
		t.Errorf("an argument: exit %d, want 2", code)
	}
}
