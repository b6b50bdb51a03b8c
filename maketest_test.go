package toolbus_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make test ends by naming every test it could not run, by the missing part and how to get
// it (make test-missing, from the lines testutil.NeedOutside records: TestNeedOutside holds
// their shape), and says nothing when it ran them all (the control: an empty record, none).
func TestMakeTestNamesWhatItCouldNotRun(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	missing := func(record string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "missing.tsv")
		if record != "" {
			if err := os.WriteFile(path, []byte(record), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out, err := exec.Command("make", "-s", "test-missing", "MISSING="+path).CombinedOutput()
		if err != nil {
			t.Fatalf("make test-missing: %v\n%s", err, out)
		}
		return string(out)
	}
	record := "Chromium\tapt-get install chromium\tcmd/toolbus\tTestConsoleAnswersQuestionInBrowser\n" +
		"Node.js and npm\tinstall Node.js 20 or later with npm\tsdk/typescript\tTestNPMTest\n" +
		"Chromium\tapt-get install chromium\tconsole\tTestConsoleOperator\n" +
		"Node.js and npm\tinstall Node.js 20 or later with npm\tsdk/typescript\tTestNPMTest\n" // a package run twice
	want := "\nmake test could not run 3 tests: a part from outside Go is missing\n" +
		"  Chromium: apt-get install chromium\n" +
		"    cmd/toolbus TestConsoleAnswersQuestionInBrowser\n" +
		"    console TestConsoleOperator\n" +
		"  Node.js and npm: install Node.js 20 or later with npm\n" +
		"    sdk/typescript TestNPMTest\n"
	if got := missing(record); got != want {
		t.Errorf("make test's last lines with tests it could not run:\n%s\nwant:\n%s", got, want)
	}
	for name, rec := range map[string]string{"no record": "", "an empty record": "\n"} {
		if got := strings.TrimSpace(missing(rec)); got != "" {
			t.Errorf("%s: make test-missing printed %q, want nothing", name, got)
		}
	}
}
