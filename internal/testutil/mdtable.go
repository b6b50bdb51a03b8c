package testutil

import (
	"os"
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
