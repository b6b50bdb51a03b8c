// Package golden compares what a test produces with a file checked in under testdata/;
// `go test -update` rewrites the files instead. It is the one -update flag of the
// module's tests: a test package importing it must not define its own.
package golden

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files (testdata/) instead of comparing with them")

// Update reports whether the tests run with -update: golden files and generated
// documents are rewritten, not compared.
func Update() bool { return *update }

// Check compares got with the file at path (relative to the test's package, e.g.
// testdata/x.json). With -update it writes got there instead, creating the directory.
// A difference fails the test with the first line that differs and how to regenerate.
func Check(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run '%s' -update creates it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -run '%s' -update rewrites it if the change is intended): %s", path, t.Name(), Diff(got, want))
	}
}

// Diff describes where got first differs from want: the line number and both lines,
// then both documents when they are short.
func Diff(got, want []byte) string {
	g, w := bytes.Split(got, []byte("\n")), bytes.Split(want, []byte("\n"))
	i := 0
	for i < len(g) && i < len(w) && bytes.Equal(g[i], w[i]) {
		i++
	}
	line := func(ls [][]byte) string {
		if i < len(ls) {
			return fmt.Sprintf("%q", ls[i])
		}
		return "(end of file)"
	}
	s := fmt.Sprintf("line %d\n got: %s\nwant: %s", i+1, line(g), line(w))
	if len(got)+len(want) < 4000 {
		s += fmt.Sprintf("\nwhole, got:\n%s\nwant:\n%s", got, want)
	}
	return s
}
