package testutil_test

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/internal/testutil"
)

// TestNATSProcessReload: the process serves clients on its URL; a reload of a file it
// takes returns once the server says so, one of a file it refuses returns its reason
// (the control: the same reload call, a file broken).
func TestNATSProcessReload(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "s.conf")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(conf, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("jetstream { store_dir: " + `"` + filepath.Join(dir, "js") + `"` + " }\nmax_payload: 65536\n")
	p := testutil.StartNATS(t, conf)
	c, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(info, "INFO ") {
		t.Fatalf("the server's greeting: %q %v", info, err)
	}
	write(strings.Replace(string(testutil.Must(os.ReadFile(conf))), "65536", "32768", 1))
	if err := p.Reload(); err != nil {
		t.Fatal(err)
	}
	write("jetstream { store_dir: ")
	if err := p.Reload(); err == nil || !strings.Contains(err.Error(), "Failed to reload") {
		t.Fatalf("the reload of a broken file: %v, want the server's refusal", err)
	}
}
