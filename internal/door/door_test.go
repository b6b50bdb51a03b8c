package door

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestSourceNoticesSameSizeRotation: a rotation that replaces a line with one of the same
// length and keeps the file's modification time (cp -p, rsync -t, an image with a fixed
// epoch) still revokes the old token, without a restart.
func TestSourceNoticesSameSizeRotation(t *testing.T) {
	oldTok, newTok := NewToken(), NewToken()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(Entry("svc", oldTok, nil)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource("", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := src.Current().Lookup(oldTok); !ok {
		t.Fatal("the listed token is refused")
	}
	if err := os.WriteFile(path, []byte(Entry("svc", newTok, nil)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, before.ModTime(), before.ModTime()); err != nil {
		t.Fatal(err)
	}
	if after, err := os.Stat(path); err != nil || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("the rotation changed the size or the time (%v): the test proves nothing", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, oldOK := src.Current().Lookup(oldTok)
		_, newOK := src.Current().Lookup(newTok)
		if !oldOK && newOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("15s after a same-size rotation: old token accepted %v, new token accepted %v", oldOK, newOK)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
