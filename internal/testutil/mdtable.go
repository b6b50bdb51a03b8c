package testutil

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// MarkdownTable returns the rows of the table of the markdown file at path whose header
// line starts with header (for example "| `error.code` |"), each as its trimmed cells,
// header and separator excluded. The documentation tests read the contract's tables
// with it, so a table that moves or loses its header fails them instead of checking
// nothing.
func MarkdownTable(t testing.TB, path, header string) [][]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, header) {
			if start >= 0 {
				t.Fatalf("%s: two tables start with %q", path, header)
			}
			start = i
		}
	}
	if start < 0 || start+1 >= len(lines) || !strings.HasPrefix(lines[start+1], "| ---") {
		t.Fatalf("%s: no table whose header starts with %q", path, header)
	}
	var rows [][]string
	for _, l := range lines[start+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: the table %q has no rows", path, header)
	}
	return rows
}

var codeSpan = regexp.MustCompile("`([^`]*)`")

// CodeSpans returns the text of every `code span` of a markdown cell, in order.
func CodeSpans(cell string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// CodeCell returns the text of a cell that is one code span and nothing else
// ("`timeout`": timeout), and "" for any other cell.
func CodeCell(cell string) string {
	if m := codeSpan.FindStringSubmatch(cell); m != nil && m[0] == cell {
		return m[1]
	}
	return ""
}

// SkipDir reports whether the repository walks of the documentation tests skip a
// directory: hidden ones, "_" ones, testdata, node_modules, and the build and data
// directories a run leaves.
func SkipDir(name string) bool {
	return strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" ||
		name == "node_modules" || name == "bin" || name == "data"
}

// MarkdownFiles returns the paths of the Markdown files under root (SkipDir), and fails
// the test when it finds fewer than 10: a walk that found nothing would check nothing.
func MarkdownFiles(t testing.TB, root string) []string {
	t.Helper()
	var docs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && SkipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			docs = append(docs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 10 {
		t.Fatalf("found only %d Markdown files under %s: %v", len(docs), root, docs)
	}
	return docs
}
