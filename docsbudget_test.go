package toolbus_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/internal/testutil"
)

// docsBudget is the most lines the documents a user reads may have in all: the README,
// docs/ and the packages' READMEs (userDocs). The goal is 4,000; this is the bound
// reached so far, lowered as pages are cut (never raised to fit a new paragraph: make
// room in the page it belongs to).
const docsBudget = 3991

// userDocs are the Markdown files a user reads: the README, every page of docs/ and the
// README of every package or example (not test data, not node_modules). CONTRACT.md is
// the wire's reference, held by its own tests.
func userDocs(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, p := range testutil.MarkdownFiles(t, ".") {
		p = filepath.ToSlash(p)
		switch {
		case strings.Contains(p, "testdata/"):
		case p == "README.md", strings.HasPrefix(p, "docs/"), filepath.Base(p) == "README.md":
			out = append(out, p)
		}
	}
	if len(out) < 10 {
		t.Fatalf("found %d user documents: the walk is broken", len(out))
	}
	return out
}

// The documents a user reads stay within docsBudget lines, and none but the evidence
// table (docs/evidence.md) names a test, CONTRACT.md included: the pages say what toolbus does and how to use
// it, the evidence table which tests hold each promise.
func TestDocsBudget(t *testing.T) {
	total := 0
	for _, p := range append(userDocs(t), "CONTRACT.md") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if p != "CONTRACT.md" {
			total += strings.Count(string(b), "\n")
		}
		if p == evidenceDoc {
			continue
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := testWordRE.FindString(line); m != "" {
				t.Errorf("%s:%d names the test %s: name tests in %s only (a row: promise, where, tests)", p, i+1, m, evidenceDoc)
			}
		}
	}
	t.Logf("the user documents have %d lines (budget %d)", total, docsBudget)
	if total > docsBudget {
		t.Errorf("the user documents have %d lines, over the budget of %d: cut the page that grew (say once, link the rest)", total, docsBudget)
	}
}
