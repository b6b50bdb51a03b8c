package toolbus_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function outside tests may be: a longer one does
// several things and reads better as named steps.
const maxFuncLines = 100

// longFuncAllowed are where functions over maxFuncLines may still stand, by file or
// folder prefix. It is empty: every function outside tests is at most maxFuncLines long;
// the list stays for a generated or vendored file that cannot be split.
var longFuncAllowed = []string{}

func longFuncOK(fn string) bool {
	for _, prefix := range longFuncAllowed {
		if strings.HasPrefix(fn, prefix) {
			return true
		}
	}
	return false
}

// longFuncs lists the functions of the non-test Go files under root longer than max
// lines, as "file:Func" with their length.
func longFuncs(t *testing.T, root string, max int) map[string]int {
	t.Helper()
	fset := token.NewFileSet()
	long := map[string]int{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n <= max {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				typ := fd.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if g, ok := typ.(*ast.IndexExpr); ok {
					typ = g.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					name = id.Name + "." + name
				}
			}
			rel, _ := filepath.Rel(root, path)
			long[filepath.ToSlash(rel)+":"+name] = n
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return long
}

// No function outside tests is longer than maxFuncLines, but where longFuncAllowed says.
func TestNoLongFunctions(t *testing.T) {
	for fn, n := range longFuncs(t, ".", maxFuncLines) {
		if longFuncOK(fn) {
			t.Logf("%s is %d lines (allowed for now)", fn, n)
			continue
		}
		t.Errorf("%s is %d lines, over %d: split it into named steps", fn, n, maxFuncLines)
	}
}

// The scan finds a long function, a long method of a generic type, and skips tests.
func TestLongFuncsFinds(t *testing.T) {
	dir := t.TempDir()
	body := strings.Repeat("\t_ = 1\n", maxFuncLines)
	write := func(name, src string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.go", "package a\n\nfunc Long() {\n"+body+"}\n\nfunc Short() {}\n\ntype G[T any] struct{}\n\nfunc (g *G[T]) M() {\n"+body+"}\n")
	write("a_test.go", "package a\n\nfunc LongTest() {\n"+body+"}\n")
	got := longFuncs(t, dir, maxFuncLines)
	if len(got) != 2 || got["a.go:Long"] != maxFuncLines+2 || got["a.go:G.M"] != maxFuncLines+2 {
		t.Fatalf("long functions %v, want a.go:Long and a.go:G.M of %d lines", got, maxFuncLines+2)
	}
}

// maxCommandLines bounds the Go lines (tests aside) of package main in cmd/toolbus: the
// command is wiring and command line; what it does lives in the packages that own it
// (cmd/toolbus/internal/node, timeline, callrun, planner/models, console, mcpserver...).
// The packages under cmd/toolbus/internal are such owners: their lines are their own, not
// the command's.
const maxCommandLines = 2000

// goLines counts the lines of the non-test Go files of the package in dir: its
// subfolders are other packages (or testdata) and are not counted.
func goLines(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n += strings.Count(string(b), "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// cmd/toolbus stays a command: package main has at most maxCommandLines lines of Go
// outside its tests.
func TestCommandStaysWiring(t *testing.T) {
	if n := goLines(t, "cmd/toolbus"); n > maxCommandLines {
		t.Errorf("cmd/toolbus has %d lines of Go outside tests, over %d: move the logic to the package that owns it", n, maxCommandLines)
	} else {
		t.Logf("cmd/toolbus: %d lines of Go outside tests (at most %d)", n, maxCommandLines)
	}
}

// The count takes the package's own non-test Go files and leaves out tests, testdata and
// the packages in subfolders.
func TestGoLinesCounts(t *testing.T) {
	dir := t.TempDir()
	for name, lines := range map[string]int{"a.go": 3, "a_test.go": 5, "sub/b.go": 2, "testdata/c.go": 7, "README.md": 4} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Repeat("x\n", lines)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := goLines(t, dir); got != 3 {
		t.Fatalf("goLines = %d, want 3 (a.go alone)", got)
	}
}
