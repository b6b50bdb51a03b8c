package main

import (
	"os"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/internal/golden"
	"github.com/toolbus/toolbus/internal/node"
)

// configurationDoc is the configuration page, whose table is the output of `toolbus env`.
const configurationDoc = "../../docs/configuration.md"

// The generated table of docs/configuration.md sits between these two lines.
const (
	envTableBegin = "<!-- toolbus env: generated, do not edit (go test ./cmd/toolbus -run ConfigurationDoc -update) -->\n"
	envTableEnd   = "<!-- end of toolbus env -->\n"
)

// envTable renders vars as the markdown table of docs/configuration.md.
func envTable(vars []node.EnvVar) string {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	var b strings.Builder
	b.WriteString("| variable | default | meaning |\n| --- | --- | --- |\n")
	for _, v := range vars {
		def := "(none)"
		if v.Default != "-" {
			def = "`" + v.Default + "`"
		}
		b.WriteString("| `" + v.Name + "` | " + cell(def) + " | " + cell(v.Meaning) + " |\n")
	}
	return b.String()
}

// The configuration page shows exactly what `toolbus env` prints: a variable added to
// Config (or a changed default or description) fails this test until the page is
// regenerated with -update.
func TestConfigurationDoc(t *testing.T) {
	vars, err := node.EnvVars(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vars) < 30 {
		t.Fatalf("toolbus env lists %d variables; the Config walk is broken", len(vars))
	}
	raw, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	head, rest, ok := strings.Cut(text, envTableBegin)
	if !ok {
		t.Fatalf("%s has no line %q", configurationDoc, envTableBegin)
	}
	table, tail, ok := strings.Cut(rest, envTableEnd)
	if !ok {
		t.Fatalf("%s has no line %q", configurationDoc, envTableEnd)
	}
	want := envTable(vars)
	if golden.Update() {
		if err := os.WriteFile(configurationDoc, []byte(head+envTableBegin+want+envTableEnd+tail), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if table != want {
		t.Errorf("the table of %s is not what toolbus env prints (go test ./cmd/toolbus -run ConfigurationDoc -update): %s",
			configurationDoc, golden.Diff([]byte(table), []byte(want)))
	}
}
