package toolbus_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/internal/testutil"
)

// evidenceDoc is the one page that names tests: its table maps each promise of the
// other pages to the tests that hold it.
const evidenceDoc = "docs/evidence.md"

var (
	testFuncRE = regexp.MustCompile(`(?m)^func (Test[A-Z0-9_]\w*)\(`)
	testNameRE = regexp.MustCompile(`^Test[A-Z0-9_][\w/]*$`)
	testSpanRE = regexp.MustCompile("`(Test[A-Z0-9_][\\w/]*)`")
	// testWordRE is a test's name anywhere in a text, quoted or not.
	testWordRE = regexp.MustCompile(`\bTest[A-Z0-9_][A-Za-z0-9_]*\b`)
)

// repoTests returns the names of the test functions of every _test.go file of the
// repository, with the file each is in.
func repoTests(t *testing.T) map[string]string {
	t.Helper()
	tests := map[string]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && path != ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFuncRE.FindAllSubmatch(b, -1) {
			tests[string(m[1])] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(tests) < 100 {
		t.Fatalf("found %d test functions in the repository: the walk is broken", len(tests))
	}
	return tests
}

// Every promise of the evidence table (docs/evidence.md) names the tests behind it, and
// every test it names exists (a subtest, Test/sub, by its test function): a promise whose
// test is renamed or deleted fails here. The checks of the trust model
// (docs/deployment-and-security.md) are among its rows.
func TestTrustModelNamesItsTests(t *testing.T) {
	tests := repoTests(t)
	rows := testutil.MarkdownTable(t, evidenceDoc, "| promise | where | tests |")
	if len(rows) < 100 {
		t.Fatalf("%s: the evidence table has %d rows: the table was not read", evidenceDoc, len(rows))
	}
	trust := 0
	for _, r := range rows {
		if len(r) != 3 {
			t.Errorf("%s: row %.80q has %d cells, want promise, where, tests", evidenceDoc, r, len(r))
			continue
		}
		if strings.Contains(r[1], "#trust-model") {
			trust++
		}
		var named []string
		for _, span := range testutil.CodeSpans(r[2]) {
			if testNameRE.MatchString(span) {
				named = append(named, span)
			}
		}
		if len(named) == 0 {
			t.Errorf("%s: the promise %.80q names no test (write the tests behind it in backticks)", evidenceDoc, r[0])
		}
	}
	if trust < 10 {
		t.Errorf("%s: %d rows point at the trust model, want one per check of its table", evidenceDoc, trust)
	}
	raw, err := os.ReadFile(evidenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range testSpanRE.FindAllStringSubmatch(string(raw), -1) {
		name, _, _ := strings.Cut(m[1], "/")
		if _, ok := tests[name]; !ok {
			t.Errorf("%s names %s, which is no test function of the repository", evidenceDoc, m[1])
		}
	}
}
