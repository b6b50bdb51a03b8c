package eventstest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/internal/testutil"
)

// AccountsProcess is a nats-server process on AccountsConf, whose team's grants change
// while it runs (Regrant): out of the test's process, since a reload under running
// JetStream clients trips the race detector inside nats-server 2.15.2 itself (its
// direct gets read the options a reload swaps, unlocked), which would fail the test
// binary at random.
type AccountsProcess struct {
	*testutil.NATSProcess
	dir, team string
}

// StartAccountsProcess writes AccountsConf(team, tools) into dir (its JetStream store
// under dir too) and runs nats-server on it until Stop; users core/core and team/team
// connect to its URL.
func StartAccountsProcess(dir, team string, tools []string) (*AccountsProcess, error) {
	a := &AccountsProcess{dir: dir, team: team}
	if err := a.write(tools); err != nil {
		return nil, err
	}
	p, err := testutil.StartNATSProcess(a.conf())
	if err != nil {
		return nil, fmt.Errorf("eventstest: %w", err)
	}
	a.NATSProcess = p
	return a, nil
}

// StartAccountsServer is StartAccountsProcess for the test, in its temp directory
// (stopped when it ends, its log shown if it failed).
func StartAccountsServer(t testing.TB, team string, tools []string) *AccountsProcess {
	t.Helper()
	a := &AccountsProcess{dir: t.TempDir(), team: team}
	if err := a.write(tools); err != nil {
		t.Fatal(err)
	}
	a.NATSProcess = testutil.StartNATS(t, a.conf())
	return a
}

func (a *AccountsProcess) conf() string { return filepath.Join(a.dir, "accounts.conf") }

func (a *AccountsProcess) write(tools []string) error {
	if err := os.WriteFile(a.conf(), []byte(AccountsConf(filepath.Join(a.dir, "js"), a.team, tools)), 0o600); err != nil {
		return fmt.Errorf("eventstest: %w", err)
	}
	return nil
}

// Connect connects as user (password its name) for the test (closed when it ends).
func (a *AccountsProcess) Connect(t testing.TB, user string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(a.URL, nats.UserInfo(user, user))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Regrant grants the team exactly tools: the file is written again and the server
// reloads it (SIGHUP), as `toolbus admin revoke` and `grant` change a team's imports
// under running connections (in the JWT kind by a pushed account; here by a reload).
func (a *AccountsProcess) Regrant(tools []string) error {
	if err := a.write(tools); err != nil {
		return err
	}
	return a.Reload()
}

// ServeGrants answers POST /grant on a loopback port: the body lists the tools the team
// is granted from then on, comma-separated (Regrant). Close the listener to stop it.
func (a *AccountsProcess) ServeGrants() (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /grant", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var tools []string
		for _, t := range strings.Split(strings.TrimSpace(string(body)), ",") {
			if t != "" {
				tools = append(tools, t)
			}
		}
		if err := a.Regrant(tools); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	go func() { _ = http.Serve(l, mux) }()
	return l, nil
}
