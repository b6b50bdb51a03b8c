package mcpauth_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/executor/mcptools"
)

// TestDocOAuthExamples: every JSON configuration of docs/mcp.md's "Servers behind OAuth"
// loads and passes the checks of a real executor, its "${NAME}" values given.
func TestDocOAuthExamples(t *testing.T) {
	raw, err := os.ReadFile("../../../docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "### Servers behind OAuth")
	if start < 0 {
		t.Fatal(`docs/mcp.md has no "### Servers behind OAuth"`)
	}
	section := doc[start:]
	if end := strings.Index(section[3:], "\n## "); end > 0 {
		section = section[:end+3]
	}
	key := ecKey(t)
	lookup := func(name string) (string, bool) {
		if strings.HasSuffix(name, "_KEY") {
			return key, true
		}
		return "secret-of-" + name, true
	}
	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) < 3 {
		t.Fatalf("found %d JSON examples, want one per grant at least", len(blocks))
	}
	for i, b := range blocks {
		var c mcptools.Config
		dec := json.NewDecoder(strings.NewReader(b[1]))
		dec.DisallowUnknownFields()
		err := dec.Decode(&c)
		if err == nil {
			c, err = c.Resolve(lookup)
		}
		if err != nil {
			t.Errorf("example %d: %v\n%s", i+1, err, b[1])
		}
		for name, s := range c.MCPServers {
			if s.OAuth == nil {
				t.Errorf("example %d: server %s has no oauth object", i+1, name)
			}
		}
	}
}
