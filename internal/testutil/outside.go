package testutil

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// OutsidePrefix starts the message of every test stopped because a part from outside Go
// is missing (Node.js and npm, the npm packages, Chromium): one marker to find them by.
const OutsidePrefix = "outside part missing: "

// MissingLogEnv names the file NeedOutside appends a line to for every test it skips
// (tab-separated: the part, how to get it, the package and the test). make test sets it
// and lists the skipped tests at the end, so that none is skipped without a word.
const MissingLogEnv = "TOOLBUS_TEST_MISSING"

// NeedOutside stops a test that needs a part from outside Go which is missing: what names
// the part, how says how to get it, err (may be nil) what was not found. Under CI (CI
// set), where make test and .ci/run install every part, the test fails; elsewhere it is skipped with
// OutsidePrefix and recorded in the file MissingLogEnv names.
func NeedOutside(t testing.TB, what, how string, err error) {
	t.Helper()
	msg := OutsidePrefix + what + " (" + how + ")"
	if err != nil {
		msg += ": " + err.Error()
	}
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	if path := os.Getenv(MissingLogEnv); path != "" {
		line := strings.Join([]string{what, how, packageDir(), t.Name()}, "\t") + "\n"
		// One write per line with O_APPEND: the test binaries that go test runs at once
		// append whole lines.
		f, ferr := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if ferr == nil {
			_, ferr = f.WriteString(line)
			ferr = errors.Join(ferr, f.Close())
		}
		if ferr != nil {
			t.Fatalf("%s: record the skip in %s: %v", msg, MissingLogEnv, ferr)
		}
	}
	t.Skip(msg)
}

// NeedNPMPackage stops the test (NeedOutside) unless node and npm are on the PATH and the
// npm package at dir (relative to the test's directory) has every one of files (relative
// to dir), which its npm ci installs or builds: make npm (and so make test) runs it.
func NeedNPMPackage(t testing.TB, dir string, files ...string) {
	t.Helper()
	for _, cmd := range []string{"node", "npm"} {
		if _, err := exec.LookPath(cmd); err != nil {
			NeedOutside(t, "Node.js and npm", "install Node.js 20 or later with npm; make test then installs the npm packages", err)
		}
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			pkg := filepath.ToSlash(filepath.Join(packageDir(), dir))
			NeedOutside(t, "the npm package "+pkg, "make npm, or npm ci --prefix "+pkg, err)
		}
	}
}

// packageDir returns the test's directory relative to the module's root (the nearest
// directory above with a go.mod), or the absolute directory when there is none.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "?"
	}
	for root := wd; ; {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			rel, err := filepath.Rel(root, wd)
			if err != nil {
				return wd
			}
			return filepath.ToSlash(rel)
		}
		parent := filepath.Dir(root)
		if parent == root {
			return wd
		}
		root = parent
	}
}
