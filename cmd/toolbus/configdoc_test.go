package main

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/internal/golden"
	"github.com/toolbus/toolbus/internal/testutil"
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

// notConfig are the TOOLBUS_ variables the documents may name that are not settings of the
// binary (toolbus env): docker compose's, the tests', the examples' (docs/configuration.md
// lists them under "Other variables").
var notConfig = map[string]string{
	"TOOLBUS_ADMIN_PASSWORD":      "docker compose: the admin user's password",
	"TOOLBUS_PLANNER_PASSWORD":    "docker compose",
	"TOOLBUS_EXECUTOR_PASSWORD":   "docker compose",
	"TOOLBUS_INJECTOR_PASSWORD":   "docker compose",
	"TOOLBUS_CLIENT_PASSWORD":     "docker compose",
	"TOOLBUS_FAULTS":              "make test-faults: runs the fault suite",
	"TOOLBUS_FAULTS_LOGS":         "the fault suite: print the processes' logs",
	"TOOLBUS_FAULT":               "TOOLBUS_FAULT_*: the fault suite's worker binary",
	"TOOLBUS_CONSOLE_SCREENSHOTS": "the console's browser test",
	"TOOLBUS_TEST_LOG":            "the tests' workers log",
	"TOOLBUS_TEST_MISSING":        "make test: the tests a missing outside part skipped",
	"TOOLBUS_NODE_TOOL":           "examples/node-executor: the Node tool's name",
	"TOOLBUS_TOKEN":               "docs/mcp.md: a host's variable holding its bearer token",
	"TOOLBUS_READ":                "the read mirror's stream name, not a variable",
	"TOOLBUS_SDK_BREAK":           "sdk/typescript: breaks one rule on purpose (conformance)",
	"TOOLBUS_TEST_NATS_URL":       "sdk/typescript: the server of its npm test",
	"TOOLBUS_TEST_TEAM_BUS":       "sdk/typescript: the two-account server of its team-account tests",
	"TOOLBUS_QUEUES":              "the queue stream's name, not a variable",
}

// docVar is a TOOLBUS_ variable named in a document; a name that ends with _ or _* is a
// family (TOOLBUS_NATS_TLS_*).
var docVar = regexp.MustCompile(`TOOLBUS_[A-Z0-9_]*[A-Z0-9](_\*|_)?`)

// Every TOOLBUS_ variable a Markdown file of the repository names exists: a setting of
// toolbus env (or, for a family such as TOOLBUS_NATS_TLS_*, the prefix of some), or one of
// notConfig. A variable renamed or removed in the code fails here until the documents
// follow.
func TestDocVariablesExist(t *testing.T) {
	vars, err := node.EnvVars(Config{})
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, v := range vars {
		known[v.Name] = true
	}
	root := filepath.Join("..", "..")
	var checked int
	for _, path := range testutil.MarkdownFiles(t, root) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, path)
		for _, m := range docVar.FindAllStringSubmatch(string(b), -1) {
			name, family := strings.TrimSuffix(m[0], m[1]), m[1] != ""
			checked++
			if known[name] || notConfig[name] != "" {
				continue
			}
			if family && slices.ContainsFunc(slices.Collect(maps.Keys(known)), func(k string) bool { return strings.HasPrefix(k, name+"_") }) {
				continue
			}
			t.Errorf("%s names %s, which is no setting of toolbus env", rel, m[0])
		}
	}
	if checked < 100 {
		t.Fatalf("found only %d TOOLBUS_ variables in the Markdown files", checked)
	}
}
