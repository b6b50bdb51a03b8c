package toolbus_test

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// inProcessReloads are the files allowed to reload an in-process nats-server, and why
// it races nothing there. nats-server 2.15.2 reads its options unlocked where a reload
// swaps them (direct gets read s.opts.MaxPending, stream creation and account
// registration read s.opts): a reload while JetStream clients of that server run trips
// the race detector inside nats-server and fails the test binary at random. A test that
// reloads under running clients runs the server as a process (testutil.StartNATS,
// eventstest.AccountsProcess).
var inProcessReloads = map[string]string{
	"embedded/configured.go":                         "toolbus server's SIGHUP, in a binary built without -race (nats-server's own SIGHUP reloads the same way)",
	"cmd/toolbus/internal/admin/clients_test.go":     "the reload runs between the test's own synchronous requests: no client of that server runs then",
	"cmd/toolbus/internal/admin/limits_live_test.go": "the reloaded server's clients are idle connections of the test, which reconnect never",
	"cmd/toolbus/internal/admin/upgrade_test.go":     "the reload runs between the test's own synchronous requests; the write service starts after it",
	"deploy/nats/natsjwt/accounts_test.go":           "the reloads run between the test's own synchronous requests: no client of that server runs then",
}

var reloadCall = regexp.MustCompile(`\.ReloadOptions\(|\.Reload\(\)`)

// TestInProcessReloadsAreListed: every Go file that reloads an in-process nats-server
// (it imports the server package and calls ReloadOptions or Reload) is listed above with
// why no client of the server runs during the reload; each listed file still reloads.
func TestInProcessReloadsAreListed(t *testing.T) {
	found := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || path == "reload_test.go" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), `"github.com/nats-io/nats-server/v2/server"`) && reloadCall.Match(b) {
			found[filepath.ToSlash(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range slices.Sorted(maps.Keys(found)) {
		if inProcessReloads[f] == "" {
			t.Errorf("%s reloads an in-process nats-server: under running JetStream clients that races inside nats-server; run it as a process (testutil.StartNATS), or list it here saying why no client runs during the reload", f)
		}
	}
	for f := range inProcessReloads {
		if !found[f] {
			t.Errorf("%s is listed as reloading an in-process nats-server but no longer does: take it off the list", f)
		}
	}
}
