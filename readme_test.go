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
