package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The test that TestNeedOutside runs in a child process of this test binary.
func TestNeedOutsideChild(t *testing.T) {
	if os.Getenv("TOOLBUS_TEST_OUTSIDE_CHILD") == "" {
		t.Skip("run by TestNeedOutside")
	}
	NeedOutside(t, "Chromium", "apt-get install chromium", nil)
	t.Error("NeedOutside returned")
}

// NeedOutside skips a test with OutsidePrefix and records it in the file
// TOOLBUS_TEST_MISSING names, the line make test's summary prints; under CI the same
// test fails instead, and records nothing.
func TestNeedOutside(t *testing.T) {
	run := func(ci string) (out, rec string, err error) {
		log := filepath.Join(t.TempDir(), "missing.tsv")
		cmd := exec.Command(os.Args[0], "-test.run=^TestNeedOutsideChild$", "-test.v")
		cmd.Env = append(os.Environ(), "TOOLBUS_TEST_OUTSIDE_CHILD=1", MissingLogEnv+"="+log, "CI="+ci)
		b, err := cmd.CombinedOutput()
		r, _ := os.ReadFile(log)
		return string(b), string(r), err
	}
	out, rec, err := run("")
	if err != nil || !strings.Contains(out, "--- SKIP: TestNeedOutsideChild") || !strings.Contains(out, OutsidePrefix+"Chromium (apt-get install chromium)") {
		t.Fatalf("outside CI: %v\n%s", err, out)
	}
	if want := "Chromium\tapt-get install chromium\tinternal/testutil\tTestNeedOutsideChild\n"; rec != want {
		t.Errorf("recorded %q, want %q", rec, want)
	}
	// Control: under CI the missing part fails the test.
	out, rec, err = run("true")
	if err == nil || !strings.Contains(out, "--- FAIL: TestNeedOutsideChild") || rec != "" {
		t.Errorf("under CI: %v, recorded %q\n%s", err, rec, out)
	}
}
