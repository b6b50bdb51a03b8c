package executor_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/toolbus/toolbus/executor"
)

func TestTruncateText(t *testing.T) {
	if out, kept := executor.TruncateText("short", 100); out != "short" || kept != 5 {
		t.Errorf("short: %q %d", out, kept)
	}
	if out, kept := executor.TruncateText("exactly", 7); out != "exactly" || kept != 7 {
		t.Errorf("exact: %q %d", out, kept)
	}
	s := strings.Repeat("a", 500) + strings.Repeat("b", 500)
	out, kept := executor.TruncateText(s, 200)
	marker := fmt.Sprintf("\n…[truncated: kept %d of 1000 bytes]…\n", kept)
	if len(out) > 200 || !strings.HasPrefix(out, "aaaa") || !strings.HasSuffix(out, "bbbb") || !strings.Contains(out, marker) ||
		kept+len(marker) != len(out) {
		t.Errorf("head+tail: %q kept %d", out, kept)
	}
	// Multi-byte runes at every cut position stay whole.
	for _, r := range []string{"é", "€", "😀"} {
		for pad := 0; pad < 4; pad++ {
			s := strings.Repeat("x", pad) + strings.Repeat(r, 300)
			for max := 60; max < 140; max++ {
				out, kept := executor.TruncateText(s, max)
				if len(out) > max || !utf8.ValidString(out) || kept > len(s) {
					t.Fatalf("rune %q pad %d max %d: %d bytes, valid %v: %q", r, pad, max, len(out), utf8.ValidString(out), out)
				}
			}
		}
	}
	// A bound too small for the marker keeps a head only.
	if out, kept := executor.TruncateText(strings.Repeat("é", 100), 9); out != "éééé" || kept != 8 {
		t.Errorf("tiny bound: %q %d", out, kept)
	}
	if out, kept := executor.TruncateText("abc", 0); out != "" || kept != 0 {
		t.Errorf("zero bound: %q %d", out, kept)
	}
}

func FuzzTruncate(f *testing.F) {
	f.Add("hello world", 5)
	f.Add(strings.Repeat("é€😀", 100), 77)
	f.Add(strings.Repeat("a", 1000), 64)
	f.Add("\xff\xfe\xfd"+strings.Repeat("b", 100), 50)
	f.Add("", 0)
	f.Add("abc", -1)
	f.Fuzz(func(t *testing.T, s string, max int) {
		out, kept := executor.TruncateText(s, max)
		if len(s) <= max {
			if out != s || kept != len(s) {
				t.Fatalf("changed text within bound")
			}
			return
		}
		if len(out) > max && !(max < 0 && out == "") {
			t.Fatalf("len %d > max %d", len(out), max)
		}
		if kept < 0 || kept > len(s) || kept > len(out) {
			t.Fatalf("kept %d of %d, out %d", kept, len(s), len(out))
		}
		if utf8.ValidString(s) && !utf8.ValidString(out) {
			t.Fatalf("invalid UTF-8 from valid input: %q", out)
		}
	})
}
