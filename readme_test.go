package toolbus_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// Every Go snippet of the README, deploy/README.md and docs/*.md is a whole file that
// compiles against this module: the snippets are built through an overlay as packages inside the module, so
// a renamed function or a changed signature breaks this test, not a reader.
func TestReadmeGoSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the snippets")
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	overlay := map[string]string{}
	var pkgs []string
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range append([]string{"README.md", "deploy/README.md"}, docs...) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range goBlock.FindAllStringSubmatch(string(text), -1) {
			src := m[1]
			if !strings.HasPrefix(src, "package ") {
				t.Errorf("%s: Go snippet %d is not a whole file (it must start with a package clause so it can be compiled):\n%s", doc, i+1, src)
				continue
			}
			tmp := filepath.Join(t.TempDir(), "main.go")
			if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join("internal", "readmesnippet", strings.NewReplacer("/", "_", ".", "_").Replace(doc)+"_"+strconv.Itoa(i+1))
			overlay[filepath.Join(root, dir, "main.go")] = tmp
			pkgs = append(pkgs, "./"+dir)
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("no Go snippets found: docs/writing-tools.md shows code")
	}
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovFile := filepath.Join(t.TempDir(), "overlay.json")
	if err := os.WriteFile(ovFile, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"build", "-overlay", ovFile, "-o", os.DevNull}, pkgs...)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Errorf("go build of the documents' Go snippets: %v\n%s", err, out)
	}
}

// `make install` puts the binary the README's `make demo` builds on the PATH under the name
// every document writes, toolbus: a go install (into GOBIN) of ./cmd/toolbus with the
// demo's build flags (so that it reuses the demo's build). The README says so, and how long
// the first build takes.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	out, err := exec.Command("make", "-n", "install").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n install: %v\n%s", err, out)
	}
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	lite := regexp.MustCompile(`(?m)^LITE\s*:=\s*(.*)$`).FindSubmatch(mk)
	if lite == nil {
		t.Fatal("the Makefile defines no LITE (the demo's build flags)")
	}
	want := "go install " + strings.TrimSpace(string(lite[1])) + " ./cmd/toolbus"
	if !strings.Contains(string(out), want) {
		t.Errorf("make install does not run %q:\n%s", want, out)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"make install", "a few minutes on 2 cores"} {
		if !strings.Contains(string(readme), s) {
			t.Errorf("the README does not say %q", s)
		}
	}
}
