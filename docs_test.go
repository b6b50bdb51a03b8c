package toolbus_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/internal/testutil"
)

// goConst is a string constant of the module's source.
type goConst struct {
	Name, Type, Value string
	// Block is the first line of the doc comment of the const block it is declared in.
	Block string
	File  string
}

// sourceConsts returns the string constants of the non-test Go files under dir (the
// module root when dir is "."), without descending into dirs that skip reports.
func sourceConsts(t *testing.T, dir string, recursive bool) []goConst {
	t.Helper()
	var out []goConst
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && (!recursive || testutil.SkipDir(d.Name())) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			block := ""
			if g.Doc != nil {
				block, _, _ = strings.Cut(g.Doc.Text(), "\n")
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				typ := ""
				if id, ok := vs.Type.(*ast.Ident); ok {
					typ = id.Name
				}
				for i, n := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						return err
					}
					out = append(out, goConst{Name: n.Name, Type: typ, Value: v, Block: block, File: path})
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// firstCells returns the cells of column 0 of a table of CONTRACT.md that are one code
// span, sorted.
func firstCells(t *testing.T, header string) []string {
	t.Helper()
	var out []string
	for _, row := range testutil.MarkdownTable(t, "CONTRACT.md", header) {
		if c := testutil.CodeCell(row[0]); c != "" {
			out = append(out, c)
		}
	}
	sort.Strings(out)
	return out
}

// sameSet fails unless the documented values are exactly the code's, naming what is
// missing on either side.
func sameSet(t *testing.T, what string, code, documented []string) {
	t.Helper()
	for _, v := range code {
		if !slices.Contains(documented, v) {
			t.Errorf("CONTRACT.md: the %s table has no row for `%s`, which the code has", what, v)
		}
	}
	for _, v := range documented {
		if !slices.Contains(code, v) {
			t.Errorf("CONTRACT.md: the %s table lists `%s`, which the code does not have", what, v)
		}
	}
}

// The tables of CONTRACT.md list every status, run outcome, error code and run code of
// the code (read from the source of package toolbus, so a constant added without its
// line in the contract fails here) and nothing else; the codes that other packages'
// tools use of their own are named somewhere in the contract or docs/.
func TestContractLists(t *testing.T) {
	var statuses, outcomes, toolCodes, runCodes []string
	for _, c := range sourceConsts(t, ".", false) {
		switch {
		case c.Type == "Status":
			statuses = append(statuses, c.Value)
		case c.Type == "RunStatus":
			if c.Value != string(toolbus.RunRunning) { // the state of a run going on, not an outcome
				outcomes = append(outcomes, c.Value)
			}
		case strings.HasPrefix(c.Name, "Code") && strings.HasPrefix(c.Block, "Stable error codes"):
			toolCodes = append(toolCodes, c.Value)
		case strings.HasPrefix(c.Name, "Code") && strings.HasPrefix(c.Block, "Run outcome codes"),
			strings.HasPrefix(c.Name, "Limit"):
			runCodes = append(runCodes, c.Value)
		case strings.HasPrefix(c.Name, "Code"):
			t.Errorf("%s: constant %s is in a const block this test does not know (%q): put it in the block of the error codes or of the run codes, or teach the test", c.File, c.Name, c.Block)
		}
	}
	if len(statuses) != 5 || len(outcomes) != 5 || len(toolCodes) < 10 || len(runCodes) < 4 {
		t.Fatalf("read %d statuses, %d outcomes, %d error codes, %d run codes from the source: the walk is broken",
			len(statuses), len(outcomes), len(toolCodes), len(runCodes))
	}
	// The injector ends a cancelled run with the error code cancelled as its run code.
	runCodes = append(runCodes, toolbus.CodeCancelled)

	sameSet(t, "status", statuses, firstCells(t, "| status | meaning |"))
	sameSet(t, "run outcome", outcomes, firstCells(t, "| outcome | when | published by |"))
	sameSet(t, "error code", toolCodes, firstCells(t, "| `error.code` | status | retryable | when |"))
	sameSet(t, "run code", runCodes, firstCells(t, "| `code` | outcome | when |"))

	// The error-code table's status column is the status the code pairs each code with.
	for _, row := range testutil.MarkdownTable(t, "CONTRACT.md", "| `error.code` | status | retryable | when |") {
		if len(row) < 2 || !toolbus.Status(row[1]).Valid() {
			t.Errorf("CONTRACT.md: error code row %q: the status cell is no status", row)
		}
	}

	// Codes of particular tools (the demo pack, MCP tools) are documented where those
	// tools are.
	var docs strings.Builder
	for _, p := range append([]string{"CONTRACT.md"}, mustGlob(t, "docs/*.md")...) {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs.Write(raw)
	}
	for _, c := range sourceConsts(t, ".", true) {
		if strings.HasPrefix(c.Name, "Code") && !strings.Contains(docs.String(), "`"+c.Value+"`") {
			t.Errorf("%s: error code %s (%s) is documented nowhere in CONTRACT.md or docs/", c.File, c.Value, c.Name)
		}
	}
}

func mustGlob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil || len(m) == 0 {
		t.Fatalf("glob %s: %v %v", pattern, m, err)
	}
	return m
}

var (
	envTag = regexp.MustCompile(`envconfig:"([A-Z0-9_]+)"`)
	envVar = regexp.MustCompile(`\bTOOLBUS_[A-Z0-9]+(?:_[A-Z0-9]+)*\b`)
)

// Every TOOLBUS_* variable the code reads is on the configuration page: the fields of
// every envconfig struct (all are read with the TOOLBUS prefix) and every variable a
// string of the code names (os.Getenv, error messages). The page's table is `toolbus
// env` itself (TestConfigurationDoc in cmd/toolbus); this catches what `toolbus env`
// does not show. The fault suite's own worker binary (faults/) is not toolbus's
// configuration and is left out.
func TestEnvVarsDocumented(t *testing.T) {
	raw, err := os.ReadFile("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	seen := map[string]string{}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (testutil.SkipDir(d.Name()) || path == "faults") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Field:
				if n.Tag != nil {
					for _, m := range envTag.FindAllStringSubmatch(n.Tag.Value, -1) {
						seen["TOOLBUS_"+m[1]] = path
					}
				}
				return true
			case *ast.BasicLit:
				if n.Kind == token.STRING {
					for _, v := range envVar.FindAllString(n.Value, -1) {
						seen[v] = path
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 30 {
		t.Fatalf("found %d TOOLBUS_* variables in the source: the walk is broken", len(seen))
	}
	for v, path := range seen {
		if !strings.Contains(page, "`"+v+"`") {
			t.Errorf("%s reads %s, which docs/configuration.md does not name", path, v)
		}
	}
}

// The Layout section of the README names every package of the module (go list ./...)
// and every top-level directory and file of the repository, and names nothing that
// does not exist.
func TestReadmeLayout(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no ## Layout section")
	}
	_, block, ok := strings.Cut(section, "```\n")
	if ok {
		block, _, ok = strings.Cut(block, "```")
	}
	if !ok {
		t.Fatal("the README's Layout section has no code block")
	}
	var entries []string
	for _, line := range strings.Split(block, "\n") {
		if line == "" || line[0] == ' ' {
			continue
		}
		entry, _, _ := strings.Cut(line, " ")
		entries = append(entries, entry)
		if strings.Contains(entry, "*") {
			continue // *.go (root)
		}
		if _, err := os.Stat(entry); err != nil {
			t.Errorf("the README's Layout names %s, which does not exist", entry)
		}
	}

	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		if rel != "." {
			want = append(want, filepath.ToSlash(rel)+"/")
		}
	}
	if len(want) < 20 {
		t.Fatalf("go list ./... listed %d packages", len(want))
	}
	top, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range top {
		name := e.Name()
		switch {
		case testutil.SkipDir(name) || name == "bench":
		case e.IsDir():
			want = append(want, name+"/")
		case strings.HasSuffix(name, ".go"), name == "go.mod", name == "go.sum", name == "README.md",
			strings.HasSuffix(name, ".test"), strings.HasSuffix(name, ".prof"), name == "toolbus", name == "custom-executor":
			// the root package (*.go), the module files, this README, build outputs
		default:
			want = append(want, name)
		}
	}
	slices.Sort(want)
	want = slices.Compact(want)
	for _, w := range want {
		// A top-level directory is named by an entry of its own or of a directory in it.
		if !slices.ContainsFunc(entries, func(e string) bool {
			return e == w || strings.HasSuffix(w, "/") && !strings.Contains(strings.TrimSuffix(w, "/"), "/") && strings.HasPrefix(e, w)
		}) {
			t.Errorf("the README's Layout does not name %s", w)
		}
	}
}
