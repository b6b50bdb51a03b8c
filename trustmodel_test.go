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

// securityDoc is the document whose promises TestTrustModelNamesItsTests checks.
const securityDoc = "docs/deployment-and-security.md"

var (
	testFuncRE = regexp.MustCompile(`(?m)^func (Test[A-Z0-9_]\w*)\(`)
	testNameRE = regexp.MustCompile(`^Test[A-Z0-9_]\w*$`)
	testSpanRE = regexp.MustCompile("`(Test[A-Z0-9_]\\w*)`")
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

// Every check of the trust model (docs/deployment-and-security.md, "Trust model") names
// the tests behind it, and every test the document names, in the table or in its prose,
// exists: a promise whose test is renamed or deleted fails here.
func TestTrustModelNamesItsTests(t *testing.T) {
	tests := repoTests(t)
	rows := testutil.MarkdownTable(t, securityDoc, "| check | defends against |")
	if len(rows) < 10 {
		t.Fatalf("%s: the trust model has %d rows: the table was not read", securityDoc, len(rows))
	}
	for _, r := range rows {
		var named []string
		for _, cell := range r {
			for _, span := range testutil.CodeSpans(cell) {
				if testNameRE.MatchString(span) {
					named = append(named, span)
				}
			}
		}
		if len(named) == 0 {
			t.Errorf("%s: the trust model check %.80q names no test (write the tests behind it in backticks)", securityDoc, r[0])
		}
	}
	raw, err := os.ReadFile(securityDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range testSpanRE.FindAllStringSubmatch(string(raw), -1) {
		if _, ok := tests[m[1]]; !ok {
			t.Errorf("%s names %s, which is no test function of the repository", securityDoc, m[1])
		}
	}
}
