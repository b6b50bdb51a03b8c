package door

import (
	"strings"
	"testing"
)

// TestParseAccessRefuses: a list with a plain token, a bad hash or a duplicate is an error
// naming the entry, never a partial list.
func TestParseAccessRefuses(t *testing.T) {
	good := Entry("bob", NewToken(), nil)
	for _, bad := range []string{
		"alice tbk_plaintexttoken",
		"alice sha256:1234",
		"alice sha256:" + strings.Repeat("zz", 32),
		"alice",
		"alice sha256:" + strings.Repeat("ab", 32) + " ops",
		good + "\n" + strings.Replace(good, "bob", "carol", 1),
	} {
		if _, err := Parse(bad, "test"); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
	l, err := Parse("# users\n\n"+good+" # bob\n;", "test")
	if err != nil || l.Len() != 1 {
		t.Fatalf("comments and blank entries: %v, %d entries", err, l.Len())
	}
}
