package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
)

// `toolbus tools` lists every tool of the catalog with the instances serving it; a
// contract whose instances are gone is listed as not offered.
func TestToolsCommand(t *testing.T) {
	p := startOpsPipeline(t, nil)
	if err := p.bus.Store().PublishTool(p.ctx, toolbus.ToolContract{Name: "orphan", Description: "nobody serves me"}, false); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := p.toolbus("tools", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rows []toolRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	byName := map[string]toolRow{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	if r := byName["calculator"]; !r.Offered || len(r.Instances) != 1 || r.Instances[0] != "exec-1" {
		t.Errorf("calculator row %+v", r)
	}
	if r := byName["orphan"]; r.Offered || len(r.Instances) != 0 {
		t.Errorf("orphan row %+v", r)
	}
	code, out, _ = p.toolbus("tools")
	if code != 0 || !strings.Contains(out, "TOOL") || !strings.Contains(out, "orphan") || !strings.Contains(out, "not offered") {
		t.Errorf("table (exit %d):\n%s", code, out)
	}
	if code, _, _ := p.toolbus("tools", "extra"); code != 2 {
		t.Errorf("an argument: exit %d, want 2", code)
	}
}
