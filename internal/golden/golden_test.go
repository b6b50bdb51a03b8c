package golden_test

import (
	"strings"
	"testing"

	"github.com/toolbus/toolbus/internal/golden"
)

func TestDiff(t *testing.T) {
	cases := []struct {
		name, got, want, line string
	}{
		{"second line", "a\nb\nc", "a\nx\nc", `line 2
 got: "b"
want: "x"`},
		{"longer got", "a\nb", "a", `line 2
 got: "b"
want: (end of file)`},
		{"shorter got", "a", "a\nb", `line 2
 got: (end of file)
want: "b"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if d := golden.Diff([]byte(tc.got), []byte(tc.want)); !strings.HasPrefix(d, tc.line) {
				t.Errorf("Diff:\n%s\nwant it to start with:\n%s", d, tc.line)
			}
		})
	}
}

// TestCheck: a matching file passes (a differing one is reported by Diff, above; the
// testdata file is this package's own).
func TestCheck(t *testing.T) {
	golden.Check(t, "testdata/check.golden", []byte("golden\n"))
}
