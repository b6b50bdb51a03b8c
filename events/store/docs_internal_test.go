package store

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/internal/testutil"
)

// docKey is one key layout of a bucket, as CONTRACT.md writes it.
type docKey struct{ bucket, key string }

// keyFuncs are the functions that build keys, each used by storeKeys below. A new key
// function fails TestContractStoreKeys until it is added here and its layout to the
// contract.
var keyFuncs = []string{"stepKey", "resultKey", "decisionKey", "ClaimKey", "slotKey", "InstanceKey", "OutputKey", "SecretKey"}

// storeKeys returns every key layout the store writes, built with the functions it
// writes with from sentinels, then written with CONTRACT.md's placeholders.
func storeKeys() []docKey {
	const run, tool, step, call, index, slot, chunk = "RUNX", "TOOLX", 7, "CALLX", 3, 5, 9
	// The index and slot first: a replacer does not match again inside a replaced step.
	numbers := strings.NewReplacer(".r."+strconv.Itoa(index), ".r.<index>", ".slot."+strconv.Itoa(slot), ".slot.<i>",
		call+"."+strconv.Itoa(chunk), call+".<i>")
	ph := strings.NewReplacer("RUNX", "<run>", "CALLX", "<call_id>", "TOOLX", "<tool>", "INSTX", "<instance>", "BOOTX", "<boot>", "TEAMX", "<team>", "SECRETX", "<name>",
		"."+strconv.Itoa(step)+".", ".<step>.", "/"+strconv.Itoa(step)+"/", "/<step>/")
	keys := []docKey{
		{BucketHistory, stepKey(run, step, "a")},
		{BucketHistory, stepKey(run, step, "s")},
		{BucketHistory, resultKey(run, step, index)},
		{BucketRuns, run},
		{BucketApprovals, decisionKey(run, step, call)},
		{BucketTools, tool},
		{BucketInstances, InstanceKey("", "INSTX", "BOOTX")},
		{BucketInstances, InstanceKey("TEAMX", "INSTX", "BOOTX")},
		{BucketClaims, ClaimKey(tool, run, step, call)},
		{BucketClaims, slotKey(tool, run, slot)},
		// PutOutput writes the chunks of an output, then its .meta.
		{BucketOutputs, OutputKey(tool, run, step, call) + "." + strconv.Itoa(chunk)},
		{BucketOutputs, OutputKey(tool, run, step, call) + ".meta"},
		{BucketSecrets, SecretKey("TEAMX", "SECRETX")},
		{BucketSecrets, SecretKey("", "SECRETX")},
	}
	for i := range keys {
		keys[i].key = ph.Replace(numbers.Replace(keys[i].key))
	}
	return keys
}

// The store table of CONTRACT.md names every bucket and every key layout the store
// writes, with the layout the code builds, and nothing else: a key added or changed
// without its line in the contract fails here.
func TestContractStoreKeys(t *testing.T) {
	// Every key function and every kind of step key in the source is covered by
	// storeKeys.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var kinds, buckets []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Recv == nil && strings.HasSuffix(strings.ToLower(n.Name.Name), "key") && !slices.Contains(keyFuncs, n.Name.Name) {
					t.Errorf("%s: key function %s is not in keyFuncs and storeKeys (add it, and its layout to CONTRACT.md)", name, n.Name.Name)
				}
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if !strings.HasPrefix(id.Name, "Bucket") || i >= len(n.Values) {
						continue
					}
					if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						buckets = append(buckets, v)
					}
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "stepKey" && len(n.Args) == 3 {
					if lit, ok := n.Args[2].(*ast.BasicLit); ok {
						kind, _ := strconv.Unquote(lit.Value)
						if !slices.Contains(kinds, kind) {
							kinds = append(kinds, kind)
						}
					}
				}
			}
			return true
		})
	}
	for _, kind := range kinds {
		if !slices.Contains([]string{"a", "s", "r"}, kind) {
			t.Errorf("the store writes step keys of kind %q, which storeKeys does not show (add it, and its layout to CONTRACT.md)", kind)
		}
	}

	rows := testutil.MarkdownTable(t, "../../CONTRACT.md", "| resource | key | value | written by |")
	var documented []docKey
	var resources []string
	for _, r := range rows {
		kind, _, _ := strings.Cut(r[0], " `")
		name := testutil.CodeSpans(r[0])
		if len(name) != 1 {
			t.Errorf("CONTRACT.md store table: the resource of %q is not one `name`", r)
			continue
		}
		resources = append(resources, name[0])
		if kind == "stream" {
			continue
		}
		key := testutil.CodeCell(r[1])
		if key == "" {
			t.Errorf("CONTRACT.md store table: %s has no `key` layout", name[0])
		}
		documented = append(documented, docKey{name[0], key})
	}
	if len(buckets) < 7 {
		t.Fatalf("found %d Bucket* constants in the source: the walk is broken", len(buckets))
	}
	for _, b := range buckets {
		if !slices.Contains(resources, b) {
			t.Errorf("CONTRACT.md store table: no row for %s", b)
		}
	}
	want := storeKeys()
	for _, k := range want {
		if !slices.Contains(documented, k) {
			t.Errorf("CONTRACT.md store table: %s has no row for the key `%s` the store writes", k.bucket, k.key)
		}
	}
	for _, k := range documented {
		if !slices.Contains(want, k) {
			t.Errorf("CONTRACT.md store table: %s lists the key `%s`, which the store does not write", k.bucket, k.key)
		}
	}
}
